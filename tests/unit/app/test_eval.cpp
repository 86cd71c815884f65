// `deepinfer eval score`'s graders (app/eval.h): answer extraction and normalisation, choice
// letters, exact match, dataset item checks, pass@1 over k samples, and the sandboxed Python
// runner (a pass, a failing assert, a timeout that is killed). Expected values are written by
// hand from the documented rules.
#include <gtest/gtest.h>

#include <chrono>

#include "app/eval.h"
#include "core/error.h"

namespace deepinfer::app::eval {
namespace {

using nlohmann::json;

std::string error_of(const json& line) {
  try {
    parse_item(line, 3);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EvalGrade, FinalAnswerExtraction) {
  EXPECT_EQ(extract_final_answer("so \\boxed{4} then \\boxed{1{2}3}"), "1{2}3");
  EXPECT_EQ(extract_final_answer("Thus the answer is 42. Next 7"), "42");
  EXPECT_EQ(extract_final_answer("Answer: x = 5, not 6"), "5");
  EXPECT_EQ(extract_final_answer("Answer: blue"), "blue");
  EXPECT_EQ(extract_final_answer("1 then 2 then -3.5 end"), "-3.5");
  EXPECT_EQ(extract_final_answer("1,024 items"), "1,024");
  EXPECT_EQ(extract_final_answer("no digits"), "");
}

TEST(EvalGrade, AnswerNormalisation) {
  EXPECT_EQ(normalize_answer(" 042 "), "42");
  EXPECT_EQ(normalize_answer("3.50"), "3.5");
  EXPECT_EQ(normalize_answer("-0"), "0");
  EXPECT_EQ(normalize_answer("$1,024$."), "1024");
  EXPECT_EQ(normalize_answer("\\text{Blue  Sky}"), "blue sky");
  EXPECT_EQ(normalize_answer("1.2.3"), "1.2.3");
  EXPECT_NE(normalize_answer("12"), normalize_answer("1.2"));
}

TEST(EvalGrade, ChoiceExtraction) {
  EXPECT_EQ(extract_choice("I think the answer is (C) because", 4), "C");
  EXPECT_EQ(extract_choice("Answer: B", 4), "B");
  EXPECT_EQ(extract_choice(" D ", 4), "D");
  EXPECT_EQ(extract_choice("A.", 4), "A");
  EXPECT_EQ(extract_choice("maybe (A) or (B)", 4), "B");
  EXPECT_EQ(extract_choice("Answer: E", 4), "");  // only A..D exist
  EXPECT_EQ(extract_choice("Answer: Because", 4), "");  // a word, not a letter
  EXPECT_EQ(extract_choice("nothing here", 4), "");
}

TEST(EvalGrade, ExactMatch) {
  EXPECT_EQ(extract_exact("thinking...\nAnswer:  Paris \nmore"), "Paris");
  EXPECT_EQ(normalize_text("  New\n York "), "new york");
  EXPECT_EQ(extract_exact(" re "), "re");
}

TEST(EvalItem, ChecksFieldsPerKind) {
  EXPECT_EQ(error_of({{"id", "a"}, {"kind", "exact_answer"}, {"prompt", "p"}, {"answer", 3}}), "");
  EXPECT_NE(error_of({{"kind", "exact_answer"}, {"answer", "3"}}).find("line 3: id"), std::string::npos);
  EXPECT_NE(error_of({{"id", "a"}, {"kind", "essay"}}).find("kind: 'essay' is not one of"), std::string::npos);
  EXPECT_NE(error_of({{"id", "a"}, {"kind", "code"}, {"prompt", "p"}}).find("tests:"), std::string::npos);
  EXPECT_NE(error_of({{"id", "a"}, {"kind", "multiple_choice"}, {"answer", "E"}}).find("answer: expected a letter A..D"),
            std::string::npos);
  EXPECT_NE(error_of({{"id", "a"}, {"kind", "structured"}, {"prompt", "p"}}).find("regex, json_schema, ebnf"),
            std::string::npos);
  EXPECT_NE(error_of({{"id", "a"}, {"kind", "exact_match"}, {"answer", "x"}, {"n", 2}}).find("n: set by"),
            std::string::npos);
  const Item it = parse_item({{"id", "a"}, {"kind", "exact_match"}, {"answer", "x"}, {"prompt", "p"},
                              {"max_tokens", 3}, {"meta", {{"source", "s"}}}},
                             1);
  EXPECT_EQ(it.request, json({{"prompt", "p"}, {"max_tokens", 3}}));  // eval fields stay out
}

json record(const std::string& id, int sample, const json& item, const std::string& text) {
  return {{"task_id", id}, {"sample", sample}, {"item", item}, {"text", text}, {"finish_reason", "stop"}};
}

TEST(EvalScore, PassAtOneOverSamples) {
  const json a = {{"id", "a"}, {"kind", "exact_answer"}, {"prompt", "p"}, {"answer", "7"}};
  const json b = {{"id", "b"}, {"kind", "multiple_choice"}, {"prompt", "p"}, {"answer", "B"}};
  std::vector<json> records = {record("a", 0, a, "it is 7"), record("a", 1, a, "it is 8"),
                               record("a", 2, a, "\\boxed{07}"), record("a", 3, a, "7.0"),
                               record("b", 0, b, "Answer: B"), record("b", 1, b, "Answer: C")};
  records[5]["finish_reason"] = "error";
  const json s = score_records(records, {});
  EXPECT_EQ(s["summary"]["tasks"], 2);
  EXPECT_EQ(s["summary"]["samples"], 6);
  EXPECT_DOUBLE_EQ(s["tasks"][0]["pass@1"].get<double>(), 0.75);  // 7, 07 and 7.0 match; 8 does not
  EXPECT_DOUBLE_EQ(s["tasks"][1]["pass@1"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["summary"]["pass@1"].get<double>(), 0.625);
  EXPECT_DOUBLE_EQ(s["summary"]["by_kind"]["multiple_choice"]["pass@1"].get<double>(), 0.5);
  EXPECT_EQ(s["samples"][1]["detail"], "expected 7");
}

TEST(EvalScore, RefusesWhatIsNotARawRecord) {
  try {
    score_records({json{{"index", 0}, {"text", "x"}}}, {});
    FAIL() << "accepted a batch result line";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 1: not a raw eval record"), std::string::npos);
  }
}

#ifdef DEEPINFER_TEST_PYTHON
TEST(EvalSandbox, RunsPythonWithATimeout) {
  const std::string py = resolve_python(DEEPINFER_TEST_PYTHON);
  EXPECT_TRUE(run_python(py, "def f(x):\n    return x + 1\nassert f(1) == 2\n", 10).passed);
  const RunResult bad = run_python(py, "assert 1 == 2, 'boom'\n", 10);
  EXPECT_FALSE(bad.passed);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output_tail.find("boom"), std::string::npos);
  // The environment is empty: a variable of ours is not visible.
  EXPECT_TRUE(run_python(py, "import os\nassert 'HOME' not in os.environ\n", 10).passed);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult slow = run_python(py, "while True:\n    pass\n", 0.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(slow.timed_out);
  EXPECT_FALSE(slow.passed);
  EXPECT_LT(s, 5.0);
}

TEST(EvalScore, CodeItemsRunTheirTests) {
  const json item = {{"id", "c"}, {"kind", "code"}, {"prompt", "def add(a, b):\n    return"},
                     {"tests", "assert add(2, 3) == 5"}};
  ScoreOptions o;
  o.python = resolve_python(DEEPINFER_TEST_PYTHON);
  const json s = score_records({record("c", 0, item, " a + b"), record("c", 1, item, " a - b")}, o);
  EXPECT_TRUE(s["samples"][0]["correct"].get<bool>());
  EXPECT_FALSE(s["samples"][1]["correct"].get<bool>());
  EXPECT_NE(s["samples"][1]["detail"].get<std::string>().find("AssertionError"), std::string::npos);
}

TEST(EvalScore, StructuredOutputsByTheIndependentValidator) {
  ScoreOptions o;
  o.python = resolve_python(DEEPINFER_TEST_PYTHON);
  o.structured_checker = DEEPINFER_TEST_CHECKER;
  o.check_structured_output = true;
  const json re_item = {{"id", "r"}, {"kind", "structured"}, {"prompt", "p"}, {"regex", "[0-9]+"}};
  const json js_item = {{"id", "j"}, {"kind", "structured"}, {"prompt", "p"},
                        {"json_schema", {{"type", "object"}, {"required", {"x"}}}}};
  const json eb_item = {{"id", "e"}, {"kind", "structured"}, {"prompt", "p"},
                        {"ebnf", "root ::= \"[\" d (\",\" d)* \"]\"\nd ::= [0-9]\n"}};
  std::vector<json> recs = {record("r", 0, re_item, "123"), record("r", 1, re_item, "12a"),
                            record("j", 0, js_item, "{\"x\": 1}"), record("j", 1, js_item, "{\"y\": 1}"),
                            record("e", 0, eb_item, "[1,2,3]"), record("e", 1, eb_item, "[1,,2]")};
  recs[3]["finish_reason"] = "length";  // cut off: counted as truncated, not invalid
  const json s = score_records(recs, o);
  const json& so = s["summary"]["structured_output"];
  EXPECT_EQ(so["checked"], 6);
  EXPECT_EQ(so["valid"], 3);
  EXPECT_EQ(so["invalid"], 2);
  EXPECT_EQ(so["truncated"], 1);
  for (int i : {0, 2, 4}) EXPECT_TRUE(s["samples"][i]["correct"].get<bool>()) << i;
  for (int i : {1, 3, 5}) EXPECT_FALSE(s["samples"][i]["correct"].get<bool>()) << i;
}
#endif

}  // namespace
}  // namespace deepinfer::app::eval
