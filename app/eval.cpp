#include "app/eval.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "app/request_line.h"
#include "core/error.h"

namespace deepinfer::app::eval {
namespace {

using nlohmann::json;

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string collapse_space(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

// Position of the last case-insensitive occurrence of `needle` in `hay`, npos if none.
size_t rfind_ci(std::string_view hay, std::string_view needle) {
  const std::string h = lower(std::string(hay)), n = lower(std::string(needle));
  return h.rfind(n);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The number starting at digit s[i] (a '-' just before it included, thousands commas and
// decimals inside it): [begin, end).
std::pair<size_t, size_t> number_at(std::string_view s, size_t i) {
  const size_t b = i > 0 && s[i - 1] == '-' ? i - 1 : i;
  size_t e = i;
  while (e < s.size() && (is_digit(s[e]) || ((s[e] == ',' || s[e] == '.') && e + 1 < s.size() && is_digit(s[e + 1]))))
    ++e;
  return {b, e};
}

std::string first_number(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (is_digit(s[i])) {
      const auto [b, e] = number_at(s, i);
      return std::string(s.substr(b, e - b));
    }
  return "";
}

std::string last_number(std::string_view s) {
  std::string best;
  for (size_t i = 0; i < s.size();) {
    if (!is_digit(s[i])) {
      ++i;
      continue;
    }
    const auto [b, e] = number_at(s, i);
    best = std::string(s.substr(b, e - b));
    i = e;
  }
  return best;
}

// Canonical text of a decimal number, or nullopt when `s` is not one.
std::optional<std::string> canonical_number(const std::string& s) {
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  std::string int_part, frac_part;
  bool dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (is_digit(c)) (dot ? frac_part : int_part).push_back(c);
    else if (c == '.' && !dot) dot = true;
    else return std::nullopt;
  }
  if (int_part.empty() && frac_part.empty()) return std::nullopt;
  int_part.erase(0, std::min(int_part.find_first_not_of('0'), int_part.size()));
  while (!frac_part.empty() && frac_part.back() == '0') frac_part.pop_back();
  if (int_part.empty()) int_part = "0";
  std::string out = int_part + (frac_part.empty() ? "" : "." + frac_part);
  if (neg && out != "0") out = "-" + out;
  return out;
}

const std::set<std::string>& eval_fields() {
  static const std::set<std::string> f = {"id", "kind", "answer", "choices", "tests", "meta"};
  return f;
}

}  // namespace

const char* to_string(Kind k) {
  switch (k) {
    case Kind::ExactAnswer: return "exact_answer";
    case Kind::MultipleChoice: return "multiple_choice";
    case Kind::ExactMatch: return "exact_match";
    case Kind::Code: return "code";
    case Kind::Structured: return "structured";
  }
  return "";
}

Kind parse_kind(std::string_view s) {
  for (Kind k : {Kind::ExactAnswer, Kind::MultipleChoice, Kind::ExactMatch, Kind::Code, Kind::Structured})
    if (s == to_string(k)) return k;
  fail("kind: '", truncate_for_message(s), "' is not one of exact_answer, multiple_choice, exact_match, code, "
       "structured");
}

Item parse_item(const json& line, int64_t line_no) {
  const std::string at = "line " + std::to_string(line_no) + ": ";
  DI_CHECK(line.is_object(), at, "expected a JSON object, got ", line.type_name());
  Item it;
  it.item = line;
  DI_CHECK(line.contains("id") && line["id"].is_string() && !line["id"].get<std::string>().empty(), at,
           "id: expected a non-empty string");
  it.id = line["id"].get<std::string>();
  DI_CHECK(line.contains("kind") && line["kind"].is_string(), at, "kind: expected a string");
  try {
    it.kind = parse_kind(line["kind"].get<std::string>());
  } catch (const Error& e) {
    fail(at, e.what());
  }
  auto need_string = [&](const char* field) {
    DI_CHECK(line.contains(field) && (line[field].is_string() || line[field].is_number()), at, field,
             ": expected a string (or number) for kind ", to_string(it.kind));
  };
  switch (it.kind) {
    case Kind::ExactAnswer:
    case Kind::ExactMatch: need_string("answer"); break;
    case Kind::MultipleChoice: {
      need_string("answer");
      int n = 4;
      if (line.contains("choices")) {
        DI_CHECK(line["choices"].is_array() && !line["choices"].empty() && line["choices"].size() <= 26, at,
                 "choices: expected an array of 1..26 entries");
        n = static_cast<int>(line["choices"].size());
      }
      const std::string a = line["answer"].is_string() ? line["answer"].get<std::string>() : "";
      DI_CHECK(a.size() == 1 && a[0] >= 'A' && a[0] < 'A' + n, at, "answer: expected a letter A..",
               static_cast<char>('A' + n - 1));
      break;
    }
    case Kind::Code:
      DI_CHECK(line.contains("tests") && line["tests"].is_string(), at, "tests: expected Python code (a string)");
      DI_CHECK(line.contains("prompt") && line["prompt"].is_string(), at,
               "prompt: code items need a text prompt (the program starts with it)");
      break;
    case Kind::Structured:
      DI_CHECK(line.contains("regex") || line.contains("json_schema") || line.contains("ebnf"), at,
               "structured items need one of regex, json_schema, ebnf");
      break;
  }
  DI_CHECK(!line.contains("n"), at, "n: set by `eval generate --samples`, not per item");
  it.request = json::object();
  for (const auto& [k, v] : line.items())
    if (!eval_fields().count(k)) it.request[k] = v;
  return it;
}

std::string extract_final_answer(std::string_view text) {
  // The last \boxed{...} (braces balanced).
  const size_t boxed = text.rfind("\\boxed{");
  if (boxed != std::string_view::npos) {
    int depth = 0;
    const size_t start = boxed + 7;
    for (size_t i = start; i < text.size(); ++i) {
      if (text[i] == '{') ++depth;
      else if (text[i] == '}' && depth-- == 0) return trim(text.substr(start, i - start));
    }
  }
  for (std::string_view marker : {"answer is", "answer:"}) {
    const size_t at = rfind_ci(text, marker);
    if (at == std::string_view::npos) continue;
    std::string_view rest = text.substr(at + marker.size());
    const size_t eol = rest.find('\n');
    const std::string line = trim(rest.substr(0, eol));
    // "The answer is 42." -> 42; "Answer: x = 5, not 6" -> 5; words kept when there is no number.
    const std::string num = first_number(line);
    return num.empty() ? line : num;
  }
  return last_number(text);
}

std::string normalize_answer(std::string_view s_in) {
  std::string s = trim(s_in);
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (s.size() >= 2 && s.front() == '$' && s.back() == '$') s = trim(std::string_view(s).substr(1, s.size() - 2));
  if (s.rfind("\\text{", 0) == 0 && !s.empty() && s.back() == '}') s = trim(std::string_view(s).substr(6, s.size() - 7));
  while (!s.empty() && s.back() == '.') s.pop_back();
  // Thousands separators: commas between digits.
  std::string no_commas;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ',' && i > 0 && i + 1 < s.size() && is_digit(s[i - 1]) && is_digit(s[i + 1])) continue;
    no_commas.push_back(s[i]);
  }
  if (auto num = canonical_number(no_commas)) return *num;
  return lower(collapse_space(s));
}

std::string extract_choice(std::string_view text, int num_choices) {
  auto letter_ok = [&](char c) { return c >= 'A' && c < 'A' + num_choices; };
  // After the last "answer is" / "answer:": the first letter, in parentheses or alone.
  for (std::string_view marker : {"answer is", "answer:"}) {
    const size_t at = rfind_ci(text, marker);
    if (at == std::string_view::npos) continue;
    std::string_view rest = text.substr(at + marker.size());
    size_t i = 0;
    while (i < rest.size() && (std::isspace(static_cast<unsigned char>(rest[i])) || rest[i] == '(' ||
                               rest[i] == '*' || rest[i] == '$'))
      ++i;
    if (i < rest.size() && letter_ok(rest[i]) &&
        (i + 1 == rest.size() || !std::isalnum(static_cast<unsigned char>(rest[i + 1]))))
      return std::string(1, rest[i]);
  }
  const std::string t = trim(text);
  if (t.size() == 1 && letter_ok(t[0])) return t;
  if (t.size() == 2 && letter_ok(t[0]) && (t[1] == '.' || t[1] == ')')) return t.substr(0, 1);
  for (size_t i = t.size(); i >= 3; --i)
    if (t[i - 3] == '(' && letter_ok(t[i - 2]) && t[i - 1] == ')') return t.substr(i - 2, 1);
  return "";
}

std::string normalize_text(std::string_view s) { return lower(collapse_space(trim(s))); }

std::string extract_exact(std::string_view text) {
  const size_t at = rfind_ci(text, "answer:");
  if (at == std::string_view::npos) return trim(text);
  std::string_view rest = text.substr(at + 7);
  return trim(rest.substr(0, rest.find('\n')));
}

std::string resolve_python(const std::string& name) {
  DI_CHECK(!name.empty() && name.find_first_of("'\"\\$`;&|<>\n") == std::string::npos,
           "--python: '", truncate_for_message(name), "' is not a plain interpreter name or path");
  const std::string cmd = "'" + name + "' -c 'import sys; print(sys.executable)' 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  DI_CHECK(p != nullptr, "--python: cannot run ", name);
  char buf[4096];
  std::string out;
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  out = trim(out);
  DI_CHECK(status == 0 && !out.empty() && out[0] == '/', "--python: cannot run ", name,
           " (give --python PATH to a Python 3 interpreter)");
  return out;
}

RunResult run_python(const std::string& python, const std::string& program, double timeout_s,
                     size_t keep_bytes) {
  RunResult result;
  std::error_code ec;
  std::string templ = (std::filesystem::temp_directory_path(ec) / "deepinfer-eval-XXXXXX").string();
  DI_CHECK(!ec && mkdtemp(templ.data()) != nullptr, "eval: cannot create a temporary directory");
  const std::filesystem::path dir = templ;
  {
    std::ofstream f(dir / "program.py", std::ios::binary);
    f << program;
    DI_CHECK(f.good(), "eval: cannot write ", (dir / "program.py").string());
  }
  const std::string out_path = (dir / "output.txt").string();
  const pid_t pid = fork();
  DI_CHECK(pid >= 0, "eval: fork failed");
  if (pid == 0) {
    // Child: own process group (killed as one), limits, no environment, stdin closed.
    setpgid(0, 0);
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int in = open("/dev/null", O_RDONLY);
    if (out < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    const rlim_t cpu = static_cast<rlim_t>(timeout_s) + 1;
    struct rlimit r;
    r = {cpu, cpu};
    setrlimit(RLIMIT_CPU, &r);
    r = {rlim_t{1} << 30, rlim_t{1} << 30};  // 1 GiB of address space
    setrlimit(RLIMIT_AS, &r);
    r = {rlim_t{16} << 20, rlim_t{16} << 20};  // 16 MiB per written file
    setrlimit(RLIMIT_FSIZE, &r);
    r = {0, 0};
    setrlimit(RLIMIT_CORE, &r);
    char* const argv[] = {const_cast<char*>(python.c_str()), const_cast<char*>("-I"),
                          const_cast<char*>("program.py"), nullptr};
    char* const envp[] = {const_cast<char*>("PATH=/usr/bin:/bin"), const_cast<char*>("PYTHONHASHSEED=0"), nullptr};
    if (python.find('/') != std::string::npos) execve(python.c_str(), argv, envp);
    else {
      for (const char* d : {"/usr/local/bin/", "/usr/bin/", "/bin/"}) {
        const std::string p = std::string(d) + python;
        execve(p.c_str(), argv, envp);
      }
    }
    _exit(127);
  }
  setpgid(pid, pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (true) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(-pid, SIGKILL);  // anything the program left running in its group
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.passed = !result.timed_out && result.exit_code == 0;
  {
    std::ifstream f(out_path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), {});
    result.output_tail = all.size() > keep_bytes ? all.substr(all.size() - keep_bytes) : all;
  }
  std::filesystem::remove_all(dir, ec);
  if (result.exit_code == 127 && !result.timed_out)
    fail("eval: cannot run ", python, " (not found in /usr/local/bin, /usr/bin, /bin; give --python PATH)");
  return result;
}

std::vector<json> check_structured(const std::string& python, const std::string& checker,
                                   const std::vector<json>& entries) {
  if (entries.empty()) return {};
  DI_CHECK(std::filesystem::exists(checker), "--structured-checker: ", checker, " does not exist");
  std::ifstream src(checker, std::ios::binary);
  const std::string code((std::istreambuf_iterator<char>(src)), {});
  // The checker reads its entries from a JSON literal appended to its source, so the sandbox
  // (no arguments, no stdin) runs it unchanged.
  std::string payload = json(entries).dump(-1, ' ', false, json::error_handler_t::replace);
  std::string program = code + "\nmain(" + json(payload).dump() + ")\n";
  const RunResult r = run_python(python, program, 60.0, size_t{64} << 20);
  DI_CHECK(!r.timed_out, "--check-structured-output: the validator timed out");
  DI_CHECK(r.exit_code == 0, "--check-structured-output: the validator failed (exit ", r.exit_code, "): ",
           r.output_tail);
  // Its verdicts are the last line of its output (one JSON array).
  std::string tail = trim(r.output_tail);
  const size_t nl = tail.rfind('\n');
  if (nl != std::string::npos) tail = tail.substr(nl + 1);
  json verdicts;
  try {
    verdicts = json::parse(tail);
  } catch (const std::exception&) {
    fail("--check-structured-output: the validator's output is not a JSON array: ", truncate_for_message(tail));
  }
  DI_CHECK(verdicts.is_array() && verdicts.size() == entries.size(), "--check-structured-output: ",
           entries.size(), " entries but ", verdicts.size(), " verdicts");
  return verdicts.get<std::vector<json>>();
}

json score_records(const std::vector<json>& records, const ScoreOptions& options) {
  struct Task {
    std::string kind;
    int samples = 0, correct = 0;
  };
  std::map<std::string, Task> tasks;
  std::vector<std::string> order;
  json samples = json::array();
  // Constrained outputs to validate: (sample index, entry).
  std::vector<size_t> so_index;
  std::vector<json> so_entries;
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    const std::string at = "record " + std::to_string(i + 1) + ": ";
    DI_CHECK(r.is_object() && r.contains("task_id") && r["task_id"].is_string() && r.contains("item") &&
                 r["item"].is_object() && r.contains("text") && r["text"].is_string(),
             at, "not a raw eval record (task_id, item, text); give `eval generate`'s --output file");
    Item item;
    try {
      item = parse_item(r["item"], static_cast<int64_t>(i + 1));
    } catch (const Error& e) {
      fail("record ", i + 1, " (item): ", e.what());
    }
    const std::string text = r["text"].get<std::string>();
    const bool failed = r.value("finish_reason", "") == "error";
    Grade g;
    const json& it = item.item;
    auto answer = [&] { return it["answer"].is_string() ? it["answer"].get<std::string>() : it["answer"].dump(); };
    switch (item.kind) {
      case Kind::ExactAnswer:
        g.extracted = extract_final_answer(text);
        g.correct = !g.extracted.empty() && normalize_answer(g.extracted) == normalize_answer(answer());
        break;
      case Kind::MultipleChoice:
        g.extracted = extract_choice(text, it.contains("choices") ? static_cast<int>(it["choices"].size()) : 4);
        g.correct = g.extracted == answer();
        break;
      case Kind::ExactMatch:
        g.extracted = extract_exact(text);
        g.correct = normalize_text(g.extracted) == normalize_text(answer());
        break;
      case Kind::Code: {
        const RunResult run = run_python(options.python, it["prompt"].get<std::string>() + text + "\n" +
                                                             it["tests"].get<std::string>() + "\n",
                                         options.code_timeout_s);
        g.correct = run.passed;
        if (!run.passed)
          g.detail = run.timed_out ? "timed out" : "exit " + std::to_string(run.exit_code) + ": " + run.output_tail;
        break;
      }
      case Kind::Structured: break;  // graded by the validator below
    }
    if (failed) g.correct = false, g.detail = "generation failed: " + r.value("error", std::string());
    if (!g.correct && g.detail.empty()) g.detail = "expected " + (it.contains("answer") ? answer() : std::string());
    const json& req = item.request;
    for (const char* k : {"regex", "json_schema", "ebnf"}) {
      if (!req.contains(k) || (!options.check_structured_output && item.kind != Kind::Structured)) continue;
      so_index.push_back(i);
      so_entries.push_back({{"kind", k}, {"source", req[k].is_string() ? req[k].get<std::string>() : req[k].dump()},
                            {"text", text}});
    }
    auto [pos, fresh] = tasks.try_emplace(item.id, Task{to_string(item.kind)});
    if (fresh) order.push_back(item.id);
    DI_CHECK(pos->second.kind == to_string(item.kind), at, "task ", item.id, " has kinds ", pos->second.kind,
             " and ", to_string(item.kind));
    samples.push_back({{"task_id", item.id}, {"sample", r.value("sample", 0)}, {"kind", to_string(item.kind)},
                       {"correct", g.correct}, {"extracted", g.extracted}, {"detail", g.detail},
                       {"finish_reason", r.value("finish_reason", "")}});
  }
  json so = nullptr;
  if (!so_entries.empty()) {
    const std::vector<json> verdicts = check_structured(options.python, options.structured_checker, so_entries);
    int valid = 0, invalid = 0, truncated = 0;
    json bad = json::array();
    for (size_t j = 0; j < verdicts.size(); ++j) {
      json& s = samples[so_index[j]];
      const bool ok = verdicts[j].value("valid", false);
      const bool cut = s["finish_reason"] == "length" || s["finish_reason"] == "error";
      s["structured_valid"] = ok;
      if (!ok) s["structured_error"] = verdicts[j].value("error", std::string());
      if (ok) ++valid;
      else if (cut) ++truncated;  // stopped before the constraint could complete
      else {
        ++invalid;
        bad.push_back({{"task_id", s["task_id"]}, {"sample", s["sample"]}, {"error", s["structured_error"]}});
      }
      if (s["kind"] == "structured") {
        s["correct"] = ok;
        s["detail"] = ok ? "" : "not valid: " + verdicts[j].value("error", std::string());
      }
    }
    so = {{"checked", verdicts.size()}, {"valid", valid}, {"invalid", invalid}, {"truncated", truncated},
          {"invalid_samples", bad}};
  }
  for (const json& s : samples) {
    Task& t = tasks[s["task_id"].get<std::string>()];
    ++t.samples;
    t.correct += s["correct"].get<bool>() ? 1 : 0;
  }
  json per_task = json::array();
  std::map<std::string, std::pair<double, int>> by_kind;
  double total = 0.0;
  for (const std::string& id : order) {
    const Task& t = tasks[id];
    const double p = static_cast<double>(t.correct) / t.samples;
    per_task.push_back({{"task_id", id}, {"kind", t.kind}, {"samples", t.samples}, {"correct", t.correct},
                        {"pass@1", p}});
    by_kind[t.kind].first += p;
    by_kind[t.kind].second += 1;
    total += p;
  }
  json kinds = json::object();
  for (const auto& [k, v] : by_kind) kinds[k] = {{"tasks", v.second}, {"pass@1", v.first / v.second}};
  json summary = {{"tasks", order.size()},
                  {"samples", samples.size()},
                  {"pass@1", order.empty() ? 0.0 : total / static_cast<double>(order.size())},
                  {"by_kind", kinds}};
  if (!so.is_null()) summary["structured_output"] = so;
  return {{"summary", summary}, {"tasks", per_task}, {"samples", samples}};
}

}  // namespace deepinfer::app::eval
