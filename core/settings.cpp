#include "core/settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace deepinfer {

namespace {

const char* type_name(SettingType t) {
  switch (t) {
    case SettingType::Bool: return "bool";
    case SettingType::Int: return "int";
    case SettingType::String: return "string";
  }
  return "?";
}

const SettingInfo* find_info(const char* name) {
  for (const SettingInfo& s : setting_table()) {
    if (std::string_view(s.name) == name) return &s;
  }
  return nullptr;
}

bool parse_bool(const std::string& text, bool* out) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "1" || t == "true" || t == "on" || t == "yes") return *out = true, true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return *out = false, true;
  return false;
}

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  // strtoll skips leading blanks: accept only [+-]digits.
  const size_t first = text[0] == '-' || text[0] == '+' ? 1 : 0;
  if (text.size() == first || !std::isdigit(static_cast<unsigned char>(text[first]))) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

}  // namespace

const std::vector<SettingInfo>& setting_table() {
  static const std::vector<SettingInfo> table = {
      // General.
      {"DEEPINFER_LOG", SettingType::String, "warn", "log level: debug, info, warn or error"},
      {"DEEPINFER_NUM_THREADS", SettingType::Int, "0",
       "CPU backend threads (0: all cores; EngineConfig.num_threads wins when set)"},
      {"DEEPINFER_BATCH_INVARIANT", SettingType::Bool, "0",
       "batch-invariant kernels: outputs independent of batch composition and chunking"},
      {"DEEPINFER_HF_MODEL_DIR", SettingType::String, "",
       "checkpoint directory when EngineConfig has neither model_dir nor random weights"},
      {"DEEPINFER_USE_NEXTN_DECODE", SettingType::Int, "",
       "speculative decoding: most draft tokens per sequence and step, 0..16 (0: off; unset: 3 "
       "with the scheduled length when the checkpoint has an MTP layer, else 0; "
       "EngineConfig.num_speculative_tokens / --num-speculative-tokens win)"},
      {"DEEPINFER_V4_FP4_PACKED", SettingType::Bool, "0",
       "DeepSeek-V4 on CUDA: keep FP4 routed experts packed (4.25 bits per weight, read by "
       "backend/cuda/moe_fp4.cu on CUDA cores: decode-sized steps) instead of dequantizing them to BF16 at load"},
      {"DEEPINFER_ENABLE_MTP_VARLEN", SettingType::Bool, "",
       "speculative decoding: verify length per request from draft confidences (DSpark); unset: "
       "on for the default k (the checkpoint's MTP layer), off for a k that is set; "
       "EngineConfig.spec_varlen / --spec-varlen win"},
      // DeepSeek-V4.1 (LoadOptions; model/deepseek_v41/truncation.h).
      {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", SettingType::String, "off",
       "DeepSeek-V4.1 prefill truncation (bounded replay): compact runs the layers above the last "
       "KV source on a prompt's last DEEPINFER_YOCO_PREFILL_KEEP_TOKENS rows only (outputs equal "
       "full prefill's only from a keep of (those layers) x (sliding_window - 1) + 1: 2414 for the "
       "released model); off runs every layer on every row"},
      {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", SettingType::Int, "140",
       "DeepSeek-V4.1 prefill truncation: prompt rows kept for the upper layers; at least "
       "sliding_window + 2 x (dspark_block_size + 1) (128 + 12 released)"},
      // Several processes, expert parallelism (model/expert_parallel.h, model/eplb.h).
      {"DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS", SettingType::Int, "0",
       "--ep: redundant experts (EPLB), a lower bound rounded up so the physical experts divide "
       "over --ep; the effective value is logged"},
      {"DEEPINFER_EPLB_INTERVAL", SettingType::Int, "",
       "--ep: steps between EPLB re-placements from measured load (0: never; unset: 1000 when "
       "there are redundant experts, else never); held during bench's timed windows"},
      {"DEEPINFER_EP_COMM_TIMING", SettingType::Bool, "0",
       "--ep: time the expert dispatch's collectives (synchronizing the device around them); "
       "bench records the seconds and bytes per step (ep_comm_s_per_step)"},
      // CUDA backend (BackendOptions::cuda).
      {"DEEPINFER_CUDA_SYNC", SettingType::Bool, "0",
       "synchronize and check errors after every CUDA op (debugging)"},
      // Tests.
      {"DEEPINFER_ACCELERATOR", SettingType::String, "",
       "tests: 'cuda' runs the golden / graph tests on the CUDA backend too"},
      {"DEEPINFER_GOLDEN_DIR", SettingType::String, "",
       "tests: directory of golden fixtures (default: tests/golden/fixtures)"},
  };
  return table;
}

Settings Settings::from(const std::function<const char*(const char*)>& lookup) {
  Settings s;
  for (const SettingInfo& info : setting_table()) {
    Value v;
    const char* raw = lookup(info.name);
    v.set = raw != nullptr && raw[0] != '\0';
    v.text = v.set ? std::string(raw) : std::string(info.default_value);
    if (!v.text.empty()) {
      if (info.type == SettingType::Bool) {
        bool b = false;
        DI_CHECK(parse_bool(v.text, &b), "environment variable ", info.name, "='", v.text,
                 "': expected a bool (1/0, true/false, on/off, yes/no)");
        v.integer = b ? 1 : 0;
      } else if (info.type == SettingType::Int) {
        DI_CHECK(parse_int(v.text, &v.integer), "environment variable ", info.name, "='", v.text,
                 "': expected an integer");
      }
    }
    s.values_[info.name] = std::move(v);
  }
  return s;
}

const Settings::Value& Settings::value(const char* name, SettingType type) const {
  const SettingInfo* info = find_info(name);
  DI_CHECK(info != nullptr, "setting ", name, " is not in the settings table (core/settings.cpp)");
  DI_CHECK(info->type == type, "setting ", name, " is a ", type_name(info->type), ", read as a ",
           type_name(type));
  return values_.at(name);
}

bool Settings::get_bool(const char* name) const { return value(name, SettingType::Bool).integer != 0; }
int64_t Settings::get_int(const char* name) const { return value(name, SettingType::Int).integer; }
const std::string& Settings::get_string(const char* name) const {
  return value(name, SettingType::String).text;
}
bool Settings::is_set(const char* name) const {
  const SettingInfo* info = find_info(name);
  DI_CHECK(info != nullptr, "setting ", name, " is not in the settings table (core/settings.cpp)");
  return values_.at(name).set;
}

std::string Settings::describe() const {
  std::ostringstream os;
  for (const SettingInfo& info : setting_table()) {
    const Value& v = values_.at(info.name);
    os << info.name << " (" << type_name(info.type) << ") = "
       << (v.set ? v.text : std::string("(unset)")) << "  [default: "
       << (info.default_value[0] != '\0' ? info.default_value : "unset") << "]\n    " << info.help
       << "\n";
  }
  return os.str();
}

const Settings& env_settings() {
  static const Settings settings = Settings::from([](const char* name) { return std::getenv(name); });
  return settings;
}

}  // namespace deepinfer
