#include "model/deepseek_v4/info.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "model/deepseek_v4/kv_layout.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer {

ParameterCount v4_parameter_count(const DeepseekV4Config& c) {
  const int64_t H = c.base.hidden_size, hc = c.hc_mult, heads = c.base.num_attention_heads, D = c.head_dim;
  const int64_t ql = c.base.q_lora_rank, G = c.o_groups, ol = c.o_lora_rank;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const int64_t E = c.base.n_routed_experts, K = c.base.num_experts_per_tok, S = c.base.n_shared_experts;
  const int64_t expert = 3 * H * c.base.moe_intermediate_size;
  const int64_t mix = (2 + hc) * hc;
  const int64_t hc_site = mix * hc * H + mix + 3;  // fn, base, scale
  const int64_t common = 2 * H + 2 * hc_site + ql * H + ql + heads * D * ql + D * H + D + G * ol * (heads * D / G) +
                         H * G * ol + heads;  // norms, hc, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sinks
  const int64_t router = E * H;                  // gate.weight (bias and tid2eid are buffers)
  ParameterCount p;
  p.embedding = 2 * c.base.vocab_size * H;       // embed and head (V4 does not tie them)
  p.total = p.embedding + H + hc * hc * H + hc + 1;  // + final norm + hc_head
  p.active_per_token = p.total;
  for (int l = 0; l < c.num_layers(); ++l) {
    const int64_t r = c.ratio(l);
    int64_t attention = common;
    switch (c.attention[static_cast<size_t>(l)]) {
      case V4AttentionKind::Csa:  // overlapping compressor (2D wide) + the indexer's (2d) + its q and weights
        attention += 2 * (2 * D * H) + r * 2 * D + D + 2 * (2 * di * H) + r * 2 * di + di + nh * di * ql + nh * H;
        break;
      case V4AttentionKind::Hca:
        attention += 2 * (D * H) + r * D + D;
        break;
      case V4AttentionKind::Window:
        break;
    }
    p.total += attention + router + (E + S) * expert;
    p.active_per_token += attention + router + (K + S) * expert;
  }
  return p;
}

std::string v4_family_kv_lines(const std::vector<KvGroupSpec>& groups, const std::string& label,
                               int64_t (*row_bytes)(const KvGroupSpec&)) {
  std::ostringstream os;
  double per_token = 0.0;
  int64_t per_seq = 0;
  os << label << std::string(label.size() < 23 ? 23 - label.size() : 1, ' ');
  for (size_t g = 0; g < groups.size(); ++g) {
    const KvGroupSpec& s = groups[g];
    const int64_t bytes = s.num_layers * row_bytes(s);
    os << (g == 0 ? "" : "                       ") << s.name << ": " << s.num_layers
       << (s.num_layers == 1 ? " layer x " : " layers x ") << s.row_dim;
    if (s.window > 0) {
      os << ", the last " << s.window << " tokens (" << bytes * s.window << " B per sequence)\n";
      per_seq += bytes * s.window;
    } else {
      os << " per " << s.tokens_per_row << " tokens (" << static_cast<double>(bytes) / s.tokens_per_row
         << " B per token)\n";
      per_token += static_cast<double>(bytes) / s.tokens_per_row;
    }
  }
  os << "KV per token           " << per_token << " B of context + " << per_seq << " B per sequence (windows)\n";
  return os.str();
}

void v4_family_info_json(const std::vector<KvGroupSpec>& groups, const ParameterCount& p,
                         int64_t (*row_bytes)(const KvGroupSpec&), nlohmann::json& out) {
  nlohmann::json list = nlohmann::json::array();
  for (const KvGroupSpec& g : groups) {
    nlohmann::json j = {{"name", g.name}, {"num_layers", g.num_layers}, {"row_dim", g.row_dim},
                        {"tokens_per_row", g.tokens_per_row}, {"window", g.window}};
    if (row_bytes != nullptr) j["format_row_bytes"] = row_bytes(g);
    list.push_back(j);
  }
  out["kv_groups"] = list;
  out["parameters"] = {{"total", p.total},
                       {"active_per_token", p.active_per_token},
                       {"embedding", p.embedding},
                       {"mtp_total", p.mtp_total},
                       {"mtp_active_per_token", p.mtp_active_per_token}};
}

std::string v4_summary(const DeepseekV4Config& c) {
  int window = 0, csa = 0, hca = 0, hash = 0;
  for (int l = 0; l < c.num_layers(); ++l) {
    const V4AttentionKind k = c.attention[static_cast<size_t>(l)];
    (k == V4AttentionKind::Csa ? csa : k == V4AttentionKind::Hca ? hca : window) += 1;
    hash += c.hash_moe[static_cast<size_t>(l)] ? 1 : 0;
  }
  const ModelConfig& b = c.base;
  std::ostringstream os;
  os << "model_type             " << b.model_type << "\n"
     << "layers                 " << c.num_layers() << ": " << window << " window-only, " << csa << " CSA (ratio "
     << c.csa_rate << ", indexer), " << hca << " HCA (ratio " << c.hca_rate << "); " << hash
     << " hash-routed MoE; + " << b.num_nextn_predict_layers << " MTP\n"
     << "hidden / vocab         " << b.hidden_size << " / " << b.vocab_size << "\n"
     << "attention              " << b.num_attention_heads << " heads x " << c.head_dim
     << " over one K=V latent (rope " << c.rope_dim << ", interleaved), q_lora " << b.q_lora_rank << ", output "
     << c.o_groups << " groups x rank " << c.o_lora_rank << ", per-head sinks\n"
     << "sliding window         " << c.sliding_window << " tokens, every layer\n";
  if (csa > 0)
    os << "indexer (CSA)          " << c.index_n_heads << " heads x " << c.index_head_dim << ", top " << c.index_topk
       << " compressed entries\n";
  os << "hyper-connections      " << c.hc_mult << " streams, " << c.hc_sinkhorn_iters << " Sinkhorn iterations\n"
     << "MoE                    " << b.n_routed_experts << " routed (top-" << b.num_experts_per_tok << ") + "
     << b.n_shared_experts << " shared, intermediate " << b.moe_intermediate_size
     << ", sqrt(softplus), scaling " << b.routed_scaling_factor << ", SwiGLU clamp " << c.swiglu_limit
     << (c.clamp_shared_expert ? " (shared too)" : " (routed only)") << "\n"
     << "rope                   window layers theta " << c.rope_theta << "; compressed layers theta "
     << c.compress_rope_theta << ", " << c.compress_rope.type;
  if (c.compress_rope.is_yarn())
    os << " (factor " << c.compress_rope.factor << ", original " << c.compress_rope.original_max_position_embeddings
       << ", beta " << c.compress_rope.beta_fast << "/" << c.compress_rope.beta_slow << ")";
  os << "\n"
     << "max positions          " << b.max_position_embeddings << "\n"
     << "weights                "
     << (b.quantization.is_fp8() ? "fp8 e4m3, block " + std::to_string(b.quantization.block_n) + "x" +
                                       std::to_string(b.quantization.block_k) +
                                       (b.quantization.scale_fmt.empty() ? "" : " " + b.quantization.scale_fmt)
                                 : std::string("unquantized"))
     << "\n";
  // KV state (bf16 rows): compressed groups grow with the context, window groups are
  // bounded per sequence.
  os << v4_family_kv_lines(v4_kv_layout(c).groups, "KV groups (bf16)",
                           [](const KvGroupSpec& g) { return g.row_bytes(DType::BF16); });
  return os.str();
}

void describe_deepseek_v4(const std::string& dir, std::shared_ptr<const CheckpointReader> reader,
                          nlohmann::json& out) {
  const DeepseekV4Config c = load_deepseek_v4_config(dir);
  (void)load_v4_weights(c, reader);  // every tensor against the config
  const ParameterCount p = v4_parameter_count(c);
  std::vector<std::string> kinds;
  for (V4AttentionKind k : c.attention)
    kinds.push_back(k == V4AttentionKind::Csa ? "csa" : k == V4AttentionKind::Hca ? "hca" : "window");
  out["summary"] = v4_summary(c);
  out["num_hidden_layers"] = c.num_layers();
  out["attention_kinds"] = kinds;
  out["num_nextn_predict_layers"] = c.base.num_nextn_predict_layers;
  out["hidden_size"] = c.base.hidden_size;
  out["vocab_size"] = c.base.vocab_size;
  out["num_attention_heads"] = c.base.num_attention_heads;
  out["head_dim"] = c.head_dim;
  out["q_lora_rank"] = c.base.q_lora_rank;
  out["o_groups"] = c.o_groups;
  out["o_lora_rank"] = c.o_lora_rank;
  out["sliding_window"] = c.sliding_window;
  out["compress_rates"] = {{"csa", c.csa_rate}, {"hca", c.hca_rate}};
  out["index_n_heads"] = c.index_n_heads;
  out["index_head_dim"] = c.index_head_dim;
  out["index_topk"] = c.index_topk;
  out["hc_mult"] = c.hc_mult;
  out["n_routed_experts"] = c.base.n_routed_experts;
  out["n_shared_experts"] = c.base.n_shared_experts;
  out["num_experts_per_tok"] = c.base.num_experts_per_tok;
  out["quantization"] = c.base.quantization.is_fp8() ? "fp8" : "none";
  v4_family_info_json(v4_kv_layout(c).groups, p, nullptr, out);
}

}  // namespace deepinfer
