"""Writes a random BF16 checkpoint of a DeepSeek-V3-architecture config under the released
(per-expert) Hugging Face names, so deepinfer and llama.cpp's GGUF converter read the same
weights (bench/cuda/vs_llamacpp_cuda.sh). Made on the GPU with torch, saved one layer per
safetensors shard with an index. Values: N(0, 0.02) for matrices, ones for norm weights, zeros
for the router's correction bias (routing then spreads tokens over the experts about evenly,
as a trained router does on average); speed does not depend on them otherwise.

usage: random_hf_checkpoint.py CONFIG.json OUT_DIR [SEED]
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

config_path, out = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
c = json.load(open(config_path))
dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator(device=dev).manual_seed(seed)
H, V = c["hidden_size"], c["vocab_size"]
heads, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
ql, kl = c["q_lora_rank"], c["kv_lora_rank"]
E, mi, di = c["n_routed_experts"], c["moe_intermediate_size"], c["intermediate_size"]
shared = c["n_shared_experts"] * mi


def mat(rows, cols):
    return (torch.randn(rows, cols, generator=g, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()


def ones(n):
    return torch.ones(n, dtype=torch.bfloat16)


os.makedirs(out, exist_ok=True)
shards = []  # (file name, {name: tensor})
shards.append(("embed", {"model.embed_tokens.weight": mat(V, H)}))
for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    t = {
        p + "input_layernorm.weight": ones(H),
        p + "post_attention_layernorm.weight": ones(H),
        p + "self_attn.q_a_proj.weight": mat(ql, H),
        p + "self_attn.q_a_layernorm.weight": ones(ql),
        p + "self_attn.q_b_proj.weight": mat(heads * (nope + rope), ql),
        p + "self_attn.kv_a_proj_with_mqa.weight": mat(kl + rope, H),
        p + "self_attn.kv_a_layernorm.weight": ones(kl),
        p + "self_attn.kv_b_proj.weight": mat(heads * (nope + vd), kl),
        p + "self_attn.o_proj.weight": mat(H, heads * vd),
    }
    if i < c["first_k_dense_replace"]:
        t.update({p + "mlp.gate_proj.weight": mat(di, H), p + "mlp.up_proj.weight": mat(di, H),
                  p + "mlp.down_proj.weight": mat(H, di)})
    else:
        t[p + "mlp.gate.weight"] = mat(E, H)
        t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(E, dtype=torch.float32)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            t.update({q + "gate_proj.weight": mat(mi, H), q + "up_proj.weight": mat(mi, H),
                      q + "down_proj.weight": mat(H, mi)})
        t.update({p + "mlp.shared_experts.gate_proj.weight": mat(shared, H),
                  p + "mlp.shared_experts.up_proj.weight": mat(shared, H),
                  p + "mlp.shared_experts.down_proj.weight": mat(H, shared)})
    shards.append((f"layer{i}", t))
shards.append(("head", {"model.norm.weight": ones(H), "lm_head.weight": mat(V, H)}))

index = {"metadata": {"total_size": 0}, "weight_map": {}}
n = len(shards)
for k, (_, t) in enumerate(shards):
    name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
    save_file(t, os.path.join(out, name), metadata={"format": "pt"})
    for key, v in t.items():
        index["weight_map"][key] = name
        index["metadata"]["total_size"] += v.numel() * v.element_size()
json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
cfg = dict(c)
cfg.setdefault("torch_dtype", "bfloat16")
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
print(f"{out}: {n} shards, {index['metadata']['total_size'] / 1e9:.2f} GB")
