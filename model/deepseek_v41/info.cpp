#include "model/deepseek_v41/info.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/info.h"
#include "model/deepseek_v41/engram_hash.h"
#include "model/deepseek_v41/kv_layout.h"
#include "model/deepseek_v41/truncation.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer {

namespace {

std::string ids(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + s + "]";
}

// What DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact would truncate (truncation.h), at the default keep.
std::string replay_line(const DeepseekV41Config& c) {
  V41PrefillTruncation t;
  try {
    t = v41_prefill_truncation(c, "compact", t.keep);
  } catch (const Error& e) {
    return std::string("compact mode refused for this config: ") + e.what();
  }
  if (!t.active()) return "nothing to truncate (no layer above the last KV source)";
  std::ostringstream os;
  os << "with DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact (default off): layers " << t.first_layer << "-"
     << t.num_layers - 1 << " on a prompt's last DEEPINFER_YOCO_PREFILL_KEEP_TOKENS rows (default " << t.keep
     << ", at least " << t.floor << "; equal to full prefill from " << t.exact_keep
     << "; the DSpark drafter's context rows are written for the kept rows)";
  return os.str();
}

}  // namespace

ParameterCount v41_parameter_count(const DeepseekV41Config& c) {
  const int64_t H = c.base.hidden_size, hc = c.hc_mult, heads = c.base.num_attention_heads,
                D = c.head_dim;
  const int64_t ql = c.base.q_lora_rank, G = c.o_groups, ol = c.o_lora_rank;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const int64_t E = c.base.n_routed_experts, K = c.base.num_experts_per_tok,
                S = c.base.n_shared_experts;
  const int64_t expert = 3 * H * c.base.moe_intermediate_size, mix = (2 + hc) * hc;
  const int64_t common = 2 * H + 2 * (mix * hc * H + mix + 3) + ql * H + ql + heads * D * ql +
                         D * H + D + G * ol * (heads * D / G) + H * G * ol + heads + E * H;
  ParameterCount p;
  p.embedding = 2 * c.base.vocab_size * H;
  p.total = p.active_per_token = p.embedding + H;
  for (int l = 0; l < c.num_layers(); ++l) {
    int64_t layer = common;
    if (c.is_kv_source(l)) layer += (c.ratio(l) > 1 ? 2 : 1) * D * H + D + di * D + di;
    if (c.is_index_source(l)) layer += nh * di * ql + nh * H;
    p.total += layer + (E + S) * expert;
    p.active_per_token += layer + (K + S) * expert;
  }
  // Engram: the tables (rows = the layer's bucket primes summed), wkv and q/k weights; a token
  // reads one row per hash column.
  if (!c.engram_layers.empty()) {
    const EngramHashing h = make_engram_hashing(c, 0);
    const int64_t hd = c.engram_head_dim, proj = (hc + 1) * H * h.cols() * hd + 2 * hc * H;
    for (size_t e = 0; e < c.engram_layers.size(); ++e) {
      p.total += h.rows[e] * hd + proj;
      p.active_per_token += h.cols() * hd + proj;
    }
  }
  return p;
}

int64_t v41_format_row_bytes(const KvGroupSpec& g) {
  return g.row_bytes(DType::BF16);  // packed rows: U8, bytes already
}

std::string v41_summary(const DeepseekV41Config& c) {
  const ModelConfig& b = c.base;
  int window = 0, r1 = 0, rn = 0;
  for (int l = 0; l < c.num_layers(); ++l)
    (c.ratio(l) == 0 ? window : c.ratio(l) == 1 ? r1 : rn) += 1;
  std::ostringstream os;
  os << "model_type             " << b.model_type << "\n"
     << "layers                 " << c.num_layers() << ": " << window << " window-only, " << rn
     << " pooled compressed (ratio > 1), " << r1 << " full-resolution compressed (ratio 1); + "
     << b.num_nextn_predict_layers << " DSpark drafter stages (block of " << c.dspark_block_size
     << ", Markov rank " << c.dspark_markov_rank << ", " << c.dspark_n_routed_experts << " experts top-"
     << c.dspark_num_experts_per_tok << "; the mtp speculator drafts with them where the checkpoint has them)\n"
     << "KV sources             " << ids(c.kv_source_layers)
     << " (compressed KV shared up to the next source)\n"
     << "index sources          " << ids(c.index_source_layers) << ", top " << c.index_topk
     << " entries";
  if (c.candidate_source_layer >= 0)
    os << "; layer " << c.candidate_source_layer << " keeps the top " << c.candidate_topk_blocks
       << " blocks of " << c.candidate_block_size << " for the later ones";
  os << "\n"
     << "hidden / vocab         " << b.hidden_size << " / " << b.vocab_size << "\n"
     << "attention              " << b.num_attention_heads << " heads x " << c.head_dim
     << " over one K=V latent (rope " << c.rope_dim << ", interleaved), q_lora " << b.q_lora_rank
     << " (no per-head q norm), output " << c.o_groups << " groups x rank " << c.o_lora_rank
     << ", sinks\n"
     << "sliding window         " << c.sliding_window << " tokens, every layer\n"
     << "indexer                " << c.index_n_heads << " heads x " << c.index_head_dim << "\n"
     << "hyper-connections      " << c.hc_mult << " streams, single-pass, " << c.hc_sinkhorn_iters
     << " Sinkhorn iterations, no hc_head\n"
     << "MoE                    " << b.n_routed_experts << " routed (top-" << b.num_experts_per_tok
     << ") + " << b.n_shared_experts << " shared, intermediate " << b.moe_intermediate_size
     << ", sqrt(softplus(x W / " << c.gate_temp << ")), scaling " << b.routed_scaling_factor
     << ", SwiGLU clamp " << c.swiglu_limit << " (shared too)\n"
     << "Engram                 "
     << (c.engram_layers.empty() ? std::string("none") : "layers " + ids(c.engram_layers)) << "\n"
     << "rms_norm_eps           " << b.rms_norm_eps << "\n"
     << "rope                   window layers theta " << c.rope_theta
     << "; compressed layers theta " << c.compress_rope_theta << ", " << c.compress_rope.type
     << "\n"
     << "max positions          " << b.max_position_embeddings << "\n"
     << "prefill replay         " << replay_line(c) << "\n"
     << "weights                "
     << (b.quantization.is_fp8() ? "fp8 e4m3, block " + std::to_string(b.quantization.block_n) +
                                       "x" + std::to_string(b.quantization.block_k) +
                                       " (routed experts as stored: FP4 or not)"
                                 : std::string("unquantized"))
     << "\n";
  os << v4_family_kv_lines(v41_kv_layout(c).groups, "KV groups (formats)", v41_format_row_bytes);
  return os.str();
}

void describe_deepseek_v41(const std::string& dir, std::shared_ptr<const CheckpointReader> reader,
                           nlohmann::json& out) {
  const DeepseekV41Config c = load_deepseek_v41_config(dir);
  (void)load_v41_weights(c, reader);  // every tensor against the config
  const ParameterCount p = v41_parameter_count(c);
  out["summary"] = v41_summary(c);
  out["num_hidden_layers"] = c.num_layers();
  out["compress_ratios"] = c.compress_ratios;
  out["kv_source_layer_ids"] = c.kv_source_layers;
  out["index_source_layer_ids"] = c.index_source_layers;
  out["candidate_source_layer_id"] = c.candidate_source_layer;
  out["engram_layer_ids"] = c.engram_layers;
  out["num_nextn_predict_layers"] = c.base.num_nextn_predict_layers;
  try {
    const V41PrefillTruncation t = v41_prefill_truncation(c, "compact", V41PrefillTruncation{}.keep);
    out["prefill_truncation"] = {{"first_layer", t.active() ? t.first_layer : -1},
                                 {"keep_floor", t.floor},
                                 {"exact_keep", t.exact_keep}};
  } catch (const Error& e) {
    out["prefill_truncation"] = {{"refused", e.what()}};
  }
  out["hidden_size"] = c.base.hidden_size;
  out["vocab_size"] = c.base.vocab_size;
  out["num_attention_heads"] = c.base.num_attention_heads;
  out["head_dim"] = c.head_dim;
  out["sliding_window"] = c.sliding_window;
  out["index_n_heads"] = c.index_n_heads;
  out["index_head_dim"] = c.index_head_dim;
  out["index_topk"] = c.index_topk;
  out["hc_mult"] = c.hc_mult;
  out["n_routed_experts"] = c.base.n_routed_experts;
  out["num_experts_per_tok"] = c.base.num_experts_per_tok;
  out["gate_temp"] = c.gate_temp;
  out["quantization"] = c.base.quantization.is_fp8() ? "fp8" : "none";
  v4_family_info_json(v41_kv_layout(c).groups, p, v41_format_row_bytes, out);
}

}  // namespace deepinfer
