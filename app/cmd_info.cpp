// deepinfer info [--env] --model DIR [--json] [--no-validate]: the DEEPINFER_* settings
// table (--env; alone it needs no --model), and a checkpoint's architecture
// facts, KV layer groups (name, layers, row bytes, tokens per row, window: what the
// KV cache holds per token), parameter counts (from the config) and tensor bytes by
// dtype (from the files). Loads every weight against the config (shape checks) and, unless
// --no-validate, reads every page once, reporting progress on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli.h"
#include "app/commands.h"
#include "core/settings.h"
#include "core/kv_group_spec.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/registry.h"
#include "model/weights.h"

namespace deepinfer::app {

namespace {

struct Progress {
  int last_percent = -1;
};

void print_progress(uint64_t done, uint64_t total, void* user) {
  auto* p = static_cast<Progress*>(user);
  const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
  if (percent == p->last_percent) return;
  p->last_percent = percent;
  std::fprintf(stderr, "\rvalidating weights: %3d%% of %.2f GB", percent,
               static_cast<double>(total) / 1e9);
  if (done == total) std::fprintf(stderr, "\n");
}

// A group's row bytes: activation-dtype rows as the backends store them (BF16 on CUDA, F32 on
// the CPU), other rows in their own dtype.
std::string row_bytes_text(const KvGroupSpec& g) {
  char buf[96];
  if (g.activation_dtype) {
    std::snprintf(buf, sizeof buf, "%lld x activation = %lld B bf16 (CUDA) / %lld B f32 (CPU)",
                  static_cast<long long>(g.row_dim), static_cast<long long>(g.row_bytes(DType::BF16)),
                  static_cast<long long>(g.row_bytes(DType::F32)));
  } else {
    std::snprintf(buf, sizeof buf, "%lld x %s = %lld B", static_cast<long long>(g.row_dim),
                  std::string(dtype_name(g.dtype)).c_str(), static_cast<long long>(g.row_bytes(DType::BF16)));
  }
  return buf;
}

std::string billions(int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3fB (%lld)", static_cast<double>(n) / 1e9,
                static_cast<long long>(n));
  return buf;
}

void print_files(const CheckpointReader& reader, const std::map<std::string, uint64_t>& bytes_by_dtype,
                 const std::map<std::string, int64_t>& tensors_by_dtype) {
  std::printf("files                  %zu, %zu tensors, %.3f GB\n", reader.files().size(),
              reader.names().size(), static_cast<double>(reader.total_bytes()) / 1e9);
  for (const auto& [dtype, bytes] : bytes_by_dtype) {
    std::printf("  %-8s %8lld tensors %16llu bytes\n", dtype.c_str(),
                static_cast<long long>(tensors_by_dtype.at(dtype)), static_cast<unsigned long long>(bytes));
  }
}

// `j` with the checkpoint's file facts added, as one JSON object.
void print_json_with_files(nlohmann::json& j, const CheckpointReader& reader,
                           const std::map<std::string, uint64_t>& bytes_by_dtype,
                           const std::map<std::string, int64_t>& tensors_by_dtype) {
  j["num_tensors"] = reader.names().size();
  j["total_bytes"] = reader.total_bytes();
  j["bytes_by_dtype"] = bytes_by_dtype;
  j["tensors_by_dtype"] = tensors_by_dtype;
  j["files"] = reader.files();
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace

int cmd_info(int argc, char** argv) {
  CLI::App app{"Print a checkpoint's config summary, parameter count and bytes by dtype", "info"};
  show_defaults(app);
  std::string model_dir;
  bool as_json = false;
  bool no_validate = false;
  bool env = false;
  app.add_option("--model", model_dir, "checkpoint directory (config.json + safetensors)");
  app.add_flag("--env", env, "print the DEEPINFER_* settings table with the values in effect");
  app.add_flag("--json", as_json, "print one JSON object instead of text");
  app.add_flag("--no-validate", no_validate, "skip reading every page of the weights");
  if (auto code = parse_flags(app, argc, argv)) return *code;
  if (env) {
    std::printf("%s", env_settings().describe().c_str());
    if (model_dir.empty()) return 0;
    std::printf("\n");
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "info: --model DIR is required (or --env for the settings table)\n");
    return 2;
  }

  const ModelConfig config = load_model_config(model_dir);
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(model_dir));
  std::map<std::string, uint64_t> bytes_by_dtype;
  std::map<std::string, int64_t> tensors_by_dtype;
  for (const auto& name : reader->names()) {
    const TensorInfo& info = reader->info(name);
    bytes_by_dtype[std::string(dtype_name(info.dtype))] += info.num_bytes();
    tensors_by_dtype[std::string(dtype_name(info.dtype))] += 1;
  }
  const Architecture& arch = find_architecture(config.model_type, config.source);
  if (arch.describe != nullptr) {  // facts beyond the shared config (V4)
    nlohmann::json j;
    arch.describe(model_dir, reader, j);
    const nlohmann::json& p = j.at("parameters");
    if (as_json) {
      j.erase("summary");
      j["model"] = model_dir;
      j["model_type"] = config.model_type;
      print_json_with_files(j, *reader, bytes_by_dtype, tensors_by_dtype);
      return 0;
    }
    std::printf("%s", j.at("summary").get<std::string>().c_str());
    std::printf("parameters             %s total, %s active per token\n",
                billions(p.at("total").get<int64_t>()).c_str(),
                billions(p.at("active_per_token").get<int64_t>()).c_str());
    print_files(*reader, bytes_by_dtype, tensors_by_dtype);
    return 0;
  }
  Progress progress;
  LoadOptions options;
  // Touching every page is cheap for small checkpoints; only large ones get a progress line.
  constexpr uint64_t kProgressMinBytes = 256ull << 20;
  if (!no_validate && reader->total_bytes() >= kProgressMinBytes) {
    options.progress = print_progress;
    options.progress_user = &progress;
  }
  // Checks every tensor's name, shape and dtype against the config.
  const ModelWeights weights = load_weights(reader, config, options);
  // Tensors beyond ModelWeights (e.g. V3.2's indexer), checked by the architecture.
  if (arch.check_extra_weights != nullptr) arch.check_extra_weights(config, *reader);
  const ParameterCount params = config.parameter_count();
  // Declared from the config (no forward built); empty when the architecture only says so
  // from a loaded model.
  const std::vector<KvGroupSpec> groups =
      arch.kv_groups != nullptr ? arch.kv_groups(config) : std::vector<KvGroupSpec>{};
  // KV bytes per token over every layer of every group, with CUDA's BF16 activation rows (a
  // compressed group holds one row per tokens_per_row tokens; a window group at most `window`).
  double kv_bytes_per_token = 0;
  for (const KvGroupSpec& g : groups)
    kv_bytes_per_token += static_cast<double>(g.num_layers) * static_cast<double>(g.row_bytes(DType::BF16)) /
                          g.tokens_per_row;

  if (as_json) {
    nlohmann::json j;
    j["model"] = model_dir;
    j["model_type"] = config.model_type;
    j["num_hidden_layers"] = config.num_hidden_layers;
    j["num_moe_layers"] = config.num_moe_layers();
    j["num_nextn_predict_layers"] = config.num_nextn_predict_layers;
    j["mtp_layers_in_checkpoint"] = weights.mtp.size();
    j["hidden_size"] = config.hidden_size;
    j["vocab_size"] = config.vocab_size;
    j["num_attention_heads"] = config.num_attention_heads;
    j["q_lora_rank"] = config.q_lora_rank;
    j["kv_lora_rank"] = config.kv_lora_rank;
    j["kv_row_dim"] = config.kv_row_dim();
    j["n_routed_experts"] = config.n_routed_experts;
    j["n_shared_experts"] = config.n_shared_experts;
    j["num_experts_per_tok"] = config.num_experts_per_tok;
    j["scoring_func"] = config.scoring_func;
    j["rope_type"] = config.rope_scaling.type;
    j["rope_theta"] = config.rope_theta;
    j["softmax_scale"] = config.softmax_scale();
    j["quantization"] = config.quantization.is_fp8() ? "fp8" : "none";
    j["parameters"] = {{"total", params.total},
                       {"active_per_token", params.active_per_token},
                       {"embedding", params.embedding},
                       {"mtp_total", params.mtp_total},
                       {"mtp_active_per_token", params.mtp_active_per_token}};
    if (arch.kv_groups != nullptr) {
      nlohmann::json list = nlohmann::json::array();
      for (const KvGroupSpec& g : groups) {
        list.push_back({{"name", g.name},
                        {"num_layers", g.num_layers},
                        {"row_dim", g.row_dim},
                        {"dtype", g.activation_dtype ? std::string("activation")
                                                     : std::string(dtype_name(g.dtype))},
                        {"row_bytes_bf16", g.row_bytes(DType::BF16)},
                        {"row_bytes_f32", g.row_bytes(DType::F32)},
                        {"tokens_per_row", g.tokens_per_row},
                        {"window", g.window}});
      }
      j["kv_groups"] = list;
      j["kv_bytes_per_token_bf16"] = kv_bytes_per_token;
    }
    print_json_with_files(j, *reader, bytes_by_dtype, tensors_by_dtype);
    return 0;
  }

  std::printf("%s\n", config.summary().c_str());
  std::printf("parameters             %s total, %s active per token\n",
              billions(params.total).c_str(), billions(params.active_per_token).c_str());
  std::printf("MTP parameters         %s (%d of %d layers in the checkpoint)\n",
              billions(params.mtp_total).c_str(), static_cast<int>(weights.mtp.size()),
              config.num_nextn_predict_layers);
  if (arch.kv_groups == nullptr) {
    std::printf("KV groups              declared by the loaded model only (%s)\n", config.model_type.c_str());
  } else {
    std::printf("KV groups              %zu, %.0f bytes per token over all layers (bf16 rows)\n",
                groups.size(), kv_bytes_per_token);
    for (const KvGroupSpec& g : groups) {
      std::printf("  %-14s %3d layers, row %s, %d token%s per row, window %s\n", g.name.c_str(),
                  g.num_layers, row_bytes_text(g).c_str(), g.tokens_per_row, g.tokens_per_row == 1 ? "" : "s",
                  g.window > 0 ? std::to_string(g.window).c_str() : "none");
    }
  }
  print_files(*reader, bytes_by_dtype, tensors_by_dtype);
  return 0;
}

}  // namespace deepinfer::app
