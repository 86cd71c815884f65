// `deepinfer eval`: two-stage evaluation. Stage 1 (`eval generate`, app/cmd_eval.cpp) runs a
// dataset through the batch runner (app/batch.h) and writes one raw JSONL record per sample;
// stage 2 (`eval score`, here) grades that file alone and never loads a model, so a grader can
// change without paying for inference again.
//
// Dataset lines (JSONL, written by the user): {"id": "...", "kind": KIND, ...eval fields,
// ...request fields}. Eval fields: id (unique string), kind, answer, choices, tests, meta.
// Every other field is a request-line field (app/request_line.h: prompt | messages |
// prompt_token_ids, sampling parameters, regex | json_schema | ebnf) and goes to the engine.
//   exact_answer     AIME-style: the final answer (last \boxed{...}, else after the last
//                    "answer is" / "Answer:", else the last number) equals `answer` after
//                    normalisation (normalize_answer).
//   multiple_choice  GPQA-style: the chosen letter (extract_choice) equals `answer` (a letter;
//                    `choices` gives how many letters there are, default 4).
//   exact_match      HLE-style: the text after the last "Answer:" (else the whole output)
//                    equals `answer` after normalize_text.
//   code             `prompt` + output + "\n" + `tests` (Python asserts) exits 0 in a sandboxed
//                    python subprocess with a timeout (run_python).
//   structured       correct when the output satisfies the request's regex / json_schema /
//                    ebnf, by the independent validator (tools/eval/check_structured.py).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepinfer::app::eval {

enum class Kind { ExactAnswer, MultipleChoice, ExactMatch, Code, Structured };
const char* to_string(Kind k);
// Throws Error naming the accepted kinds.
Kind parse_kind(std::string_view s);

// A dataset item checked: fields present with the right types for its kind. `request` is the
// request line for the engine (every non-eval field). Throws Error("line N: <field>: ...").
struct Item {
  std::string id;
  Kind kind = Kind::ExactMatch;
  nlohmann::json item;     // the whole line as given
  nlohmann::json request;  // request-line fields only
};
Item parse_item(const nlohmann::json& line, int64_t line_no);

// AIME-style answer extraction and normalisation.
std::string extract_final_answer(std::string_view text);
// Trims, drops surrounding $...$ and \text{}, a trailing '.', thousands separators in
// numbers; a number is written canonically ("042" -> "42", "3.50" -> "3.5", "-0" -> "0");
// other text is lower-cased with runs of whitespace collapsed.
std::string normalize_answer(std::string_view s);
// GPQA-style: the letter chosen among the first num_choices letters ("" when none): the
// last "answer is (X)" / "Answer: X" / "answer: X", else a lone letter as the whole output,
// else the last parenthesised "(X)".
std::string extract_choice(std::string_view text, int num_choices);
// Exact match: trimmed, whitespace runs collapsed, lower-cased.
std::string normalize_text(std::string_view s);
std::string extract_exact(std::string_view text);

// Runs `program` with `python` (isolated mode: -I) in a fresh temporary directory, in its
// own process group, with an empty environment, CPU-time / memory / file-size limits and a
// wall-clock timeout (the group is killed). Passed: exit status 0 within the time.
struct RunResult {
  bool passed = false;
  bool timed_out = false;
  int exit_code = -1;
  std::string output_tail;  // last bytes of its stdout + stderr
};
// The interpreter's real path (sys.executable), asked once with the full environment (pyenv
// shims and virtual environments need theirs); the sandbox then runs that path with none.
std::string resolve_python(const std::string& name);
// output_tail keeps the last keep_bytes of the output.
RunResult run_python(const std::string& python, const std::string& program, double timeout_s,
                     size_t keep_bytes = 400);

// One sample's grade.
struct Grade {
  bool correct = false;
  std::string extracted;  // what the grader read from the output
  std::string detail;     // why not (empty when correct)
};

struct ScoreOptions {
  std::string python = "python3";
  double code_timeout_s = 10.0;
  bool check_structured_output = false;
  std::string structured_checker;  // path of tools/eval/check_structured.py
};

// Grades every raw record (stage 2). Returns {"summary": ..., "samples": [...]}: pass@1 per
// task is the mean of its k samples' grades; the summary averages tasks, overall and by kind.
// With check_structured_output (or structured items) the records with a constraint are
// checked by the independent validator; "structured_output" counts valid, invalid, truncated.
nlohmann::json score_records(const std::vector<nlohmann::json>& records, const ScoreOptions& options);

// The structured-output validator over records (kind, source, text): one verdict per entry
// ({"valid": bool, "error": "..."}) from `checker` run by `python`.
std::vector<nlohmann::json> check_structured(const std::string& python, const std::string& checker,
                                             const std::vector<nlohmann::json>& entries);

}  // namespace deepinfer::app::eval
