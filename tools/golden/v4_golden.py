"""DeepSeek-V4 golden fixtures (make_golden.py --only v4_tiny v4_fp8_fp4): tiny random checkpoints and
transformers 5.17's DeepseekV4ForCausalLM reference outputs (fp32, eager, CPU).

  v4_tiny     transformers naming (model.layers.N.self_attn.q_a_proj, fused mlp.experts.gate_up_proj, ...),
              config in transformers spelling (layer_types / compress_rates / mlp_layer_types, nested
              rope_parameters); BF16 linears, F32 hc / sinks / position_bias / norms / bias; layers:
              0 window-only + hash MoE, 1 CSA (rate 4, indexer top 3 of up to 13 entries), 2 HCA (rate 8);
              window 6; prompt 20 tokens, so every kind sees several groups.
  v4_fp8_fp4  DeepSeek naming (layers.N.attn.wq_a, layers.N.ffn.experts.E.w1, embed, head, hc_head_fn, ...),
              config in DeepSeek spelling (compress_ratios [0, 4, 128], num_hash_layers, rope_scaling yarn,
              quantization_config fp8 ue8m0); dense linears F8_E4M3 with E8M0 128x128 `.scale` (partial
              blocks), routed experts FP4 e2m1 packed I8 [out, in/2] with E8M0 `.scale` [out, in/32];
              prompt 136 tokens (> one 128-token HCA group). The reference runs on the DEQUANTIZED weights.
"""
from __future__ import annotations

import copy
import json
import math
import os
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

COMMON = dict(vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              head_dim=32, q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2,
              n_shared_experts=1, index_n_heads=16, index_head_dim=16, index_topk=3, sliding_window=6,
              max_position_embeddings=512, rms_norm_eps=1e-6, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
              swiglu_limit=10.0, routed_scaling_factor=1.5, bos_token_id=0, eos_token_id=1,
              num_nextn_predict_layers=0, tie_word_embeddings=False)

V4_FIXTURES = {
    "v4_tiny": dict(seed=4101, prompt_len=20, gen_len=32, quant=False, spelling="hf",
                    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
                    rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                    mlp_layer_types=["hash_moe", "moe", "moe"]),
    "v4_fp8_fp4": dict(seed=4202, prompt_len=136, gen_len=8, quant=True, spelling="official",
                       compress_ratios=[0, 4, 128], num_hash_layers=1),
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1}


def hf_config(fx):
    kw = dict(COMMON)
    if fx["spelling"] == "hf":
        kw.update(layer_types=fx["layer_types"], compress_rates=fx["rates"], mlp_layer_types=fx["mlp_layer_types"],
                  partial_rotary_factor=0.25,
                  rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                                   "compress": dict(YARN, rope_theta=160000.0, partial_rotary_factor=0.25,
                                                    attention_factor=1.0)})
    else:
        kw.update(compress_ratios=fx["compress_ratios"], num_hash_layers=fx["num_hash_layers"], qk_rope_head_dim=8,
                  rope_theta=10000.0, compress_rope_theta=160000.0, rope_parameters=dict(YARN))
    cfg = DeepseekV4Config(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def init(model, gen):
    H = model.config.hidden_size
    for name, p in sorted(list(model.named_parameters()) + list(model.named_buffers()), key=lambda x: x[0]):
        if "rotary" in name or "inv_freq" in name:
            continue
        s = p.shape
        if name.endswith("tid2eid"):
            v = torch.stack([torch.randperm(model.config.n_routed_experts, generator=gen)[:s[1]] for _ in range(s[0])])
        elif name.endswith("e_score_correction_bias"):
            v = 0.3 * torch.randn(s, generator=gen)
        elif name.endswith("sinks"):
            v = torch.randn(s, generator=gen)
        elif name.endswith("position_bias"):
            v = 0.5 * torch.randn(s, generator=gen)
        elif name.endswith(("hc.base", "hc_base")):
            v = 0.5 * torch.randn(s, generator=gen)
        elif name.endswith(("hc.scale", "hc_scale")):
            v = 1.0 + 0.1 * torch.randn(s, generator=gen)
        elif "norm" in name:
            v = 1.0 + 0.2 * torch.randn(s, generator=gen)
        elif "embed_tokens" in name:
            v = torch.randn(s, generator=gen)
        elif name == "lm_head.weight":
            v = torch.randn(s, generator=gen) * (2.5 / math.sqrt(s[-1]))
        elif name.endswith("mlp.gate.weight"):
            v = torch.randn(s, generator=gen) * (1.5 / math.sqrt(s[-1]))
        else:  # linears [out, in], fused experts [E, out, in], hc fn [mix, hc*H]
            v = torch.randn(s, generator=gen) / math.sqrt(s[-1])
        with torch.no_grad():
            p.copy_(v.to(p.dtype))


# --- DeepSeek's names (inverse of transformers' conversion_mapping.py "deepseek_v4")
_RULES = [(".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
          (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
          (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
          (".self_attn.", ".attn."), (".mlp.", ".ffn."), (".input_layernorm.", ".attn_norm."),
          (".post_attention_layernorm.", ".ffn_norm."), (".attn_hc.fn", ".hc_attn_fn"), (".attn_hc.base", ".hc_attn_base"),
          (".attn_hc.scale", ".hc_attn_scale"), (".ffn_hc.fn", ".hc_ffn_fn"), (".ffn_hc.base", ".hc_ffn_base"),
          (".ffn_hc.scale", ".hc_ffn_scale"), (".sinks", ".attn_sink"), ("compressor.kv_norm.", "compressor.norm."),
          ("indexer.kv_norm.", "indexer.norm."), (".position_bias", ".ape"), (".q_a_proj.", ".wq_a."),
          (".q_b_proj.", ".wq_b."), (".kv_proj.", ".wkv."), (".gate_proj.", ".wgate."), (".o_a_proj.", ".wo_a."),
          (".o_b_proj.", ".wo_b."), (".q_a_norm.", ".q_norm."), (".gate.e_score_correction_bias", ".gate.bias"),
          (".shared_experts.wgate.", ".shared_experts.w1."), (".shared_experts.down_proj.", ".shared_experts.w2."),
          (".shared_experts.up_proj.", ".shared_experts.w3.")]


def official_name(k):
    glob = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
            "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
            "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
    if k in glob:
        return glob[k]
    k = k[len("model."):]
    for a, b in _RULES:
        k = k.replace(a, b)
    return k


def e8m0_scale(amax, qmax):
    """Power-of-two scale 2^ceil(log2(amax / qmax)) as E8M0 bytes (ue8m0)."""
    e = torch.ceil(torch.log2(torch.clamp(amax / qmax, min=2.0 ** -126)))
    return (e + 127).clamp(0, 254).to(torch.uint8)


def fp8_quant(w, block=128):
    n, k = w.shape
    bn, bk = -(-n // block), -(-k // block)
    exps = torch.zeros(bn, bk, dtype=torch.uint8)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(bn):
        for j in range(bk):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            exps[i, j] = e8m0_scale(blk.abs().max(), 448.0)
            s = 2.0 ** (exps[i, j].float() - 127)
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (blk / s).to(torch.float8_e4m3fn)
    return q, exps.view(torch.float8_e8m0fnu)


def fp8_dequant(q, s8, block=128):
    s = s8.to(torch.float32).repeat_interleave(block, 0)[:q.shape[0]].repeat_interleave(block, 1)[:, :q.shape[1]]
    return q.to(torch.float32) * s


def fp4_quant(w):
    n, k = w.shape
    g = w.view(n, k // 32, 32)
    exps = e8m0_scale(g.abs().amax(-1), 6.0)
    s = (2.0 ** (exps.float() - 127)).unsqueeze(-1)
    x = (g / s).view(n, k)
    codes = (x.unsqueeze(-1) - E2M1[:8].unsqueeze(0).unsqueeze(0) * torch.sign(x).unsqueeze(-1)).abs().argmin(-1)
    codes = codes | ((x < 0).to(torch.long) << 3)
    codes = codes.to(torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, exps.view(torch.float8_e8m0fnu)


def fp4_dequant(packed, s8):
    b = packed.view(torch.uint8).long()
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(1)
    return E2M1[codes] * s8.to(torch.float32).repeat_interleave(32, dim=1)


def is_fp8_dense(name):
    if not name.endswith(".weight") or ".ffn.experts." in name:
        return False
    return any(t in name for t in (".attn.wq_a.", ".attn.wq_b.", ".attn.wkv.", ".attn.wo_a.", ".attn.wo_b.",
                                   ".shared_experts.", ".attn.indexer.wq_b."))


def to_disk(sd, fx, n_experts):
    """transformers state dict (fp32) -> on-disk tensors; returns (disk, dequantized-transformers-sd)."""
    disk, back = {}, {}
    f32_keys = ("hc_", ".sinks", ".position_bias", "norm", "e_score_correction_bias", "hc_head")
    for k, v in sd.items():
        v = v.detach().float().cpu()
        if k.endswith("tid2eid"):
            disk[k] = v.to(torch.int64)
            back[k] = disk[k]
        elif any(t in k for t in f32_keys) or "attn_hc" in k or "ffn_hc" in k:
            disk[k] = v.contiguous()
            back[k] = v
        else:
            disk[k] = v.to(torch.bfloat16).contiguous()
            back[k] = disk[k].float()
    if not fx["quant"]:
        return disk, back
    out = {}
    for k, v in disk.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            continue
        o = official_name(k)
        if is_fp8_dense(o):
            q, s = fp8_quant(v.float())
            out[o], out[o[:-len(".weight")] + ".scale"] = q, s
            back[k] = fp8_dequant(q, s)
        else:
            out[o] = v
    for k in list(disk):
        if not k.endswith("mlp.experts.gate_up_proj"):
            continue
        pre = k[:-len("gate_up_proj")]
        gu, dn = disk[k].float(), disk[pre + "down_proj"].float()
        inter = gu.shape[1] // 2
        layer = official_name(pre + "x").rsplit(".experts.", 1)[0]
        gu_back, dn_back = [], []
        for e in range(n_experts):
            parts = {}
            for wname, w in (("w1", gu[e, :inter]), ("w3", gu[e, inter:]), ("w2", dn[e])):
                p, s = fp4_quant(w)
                out[f"{layer}.experts.{e}.{wname}.weight"], out[f"{layer}.experts.{e}.{wname}.scale"] = p, s
                parts[wname] = fp4_dequant(p, s)
            gu_back.append(torch.cat([parts["w1"], parts["w3"]], 0))
            dn_back.append(parts["w2"])
        back[k], back[pre + "down_proj"] = torch.stack(gu_back), torch.stack(dn_back)
    return dict(sorted(out.items())), back


def r8(rows):
    return [[float(f"{x:.8g}") for x in row] for row in rows]


@torch.no_grad()
def greedy(model, prompt, n):
    ids, gaps = list(prompt), []
    for _ in range(n):
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        gaps.append(float(top2[0] - top2[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], min(gaps)


def config_json(cfg, fx):
    d = cfg.to_dict()
    for k in ("_attn_implementation_autoset", "_name_or_path", "_attn_implementation", "attn_implementation"):
        d.pop(k, None)
    d["architectures"] = ["DeepseekV4ForCausalLM"]
    if fx["spelling"] == "official":
        for k in ("layer_types", "compress_rates", "mlp_layer_types", "partial_rotary_factor"):
            d.pop(k, None)
        d["compress_ratios"] = fx["compress_ratios"]
        d["num_hash_layers"] = fx["num_hash_layers"]
        d["qk_rope_head_dim"] = 8
        d["rope_theta"] = 10000.0
        d["compress_rope_theta"] = 160000.0
        d.pop("rope_parameters", None)
        d["rope_scaling"] = {"type": "yarn", "factor": YARN["factor"],
                             "original_max_position_embeddings": YARN["original_max_position_embeddings"],
                             "beta_fast": YARN["beta_fast"], "beta_slow": YARN["beta_slow"]}
        d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    return d


def build_v4_fixture(name, fx, out_root, device="cpu"):
    t0 = time.time()
    fdir = os.path.join(out_root, name)
    os.makedirs(fdir, exist_ok=True)
    cfg = hf_config(fx)
    torch.manual_seed(fx["seed"])
    gen = torch.Generator().manual_seed(fx["seed"])
    model = DeepseekV4ForCausalLM(cfg).float()
    init(model, gen)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    disk, back = to_disk(sd, fx, cfg.n_routed_experts)
    save_file(disk, os.path.join(fdir, "model.safetensors"), metadata={"format": "pt"})
    cfg_d = config_json(cfg, fx)
    with open(os.path.join(fdir, "config.json"), "w") as f:
        json.dump(cfg_d, f, indent=2)
    # The oracle: the same architecture with exactly the stored (dequantized) values in fp32.
    ref = DeepseekV4ForCausalLM(copy.deepcopy(cfg)).float().eval()
    missing, unexpected = ref.load_state_dict(back, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    if not fx["quant"]:  # the on-disk checkpoint loads through transformers' own loader too
        loaded = DeepseekV4ForCausalLM.from_pretrained(fdir, dtype=torch.float32, attn_implementation="eager").eval()
    pgen = torch.Generator().manual_seed(fx["seed"] + 7)
    prompt = torch.randint(3, cfg.vocab_size, (fx["prompt_len"],), generator=pgen).tolist()
    checks = {}
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = ref(ids, use_cache=False).logits[0].float()
        if not fx["quant"]:
            checks["load_path_max_abs_diff"] = float((loaded(ids, use_cache=False).logits[0] - logits).abs().max())
        greedy_ids, min_gap = greedy(ref, prompt, fx["gen_len"])
        gen_ids = ref.generate(ids, max_new_tokens=fx["gen_len"], min_new_tokens=fx["gen_len"], do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        checks.update(generate_with_cache_matches=gen_ids == greedy_ids, min_top1_top2_gap_greedy=min_gap,
                      logit_std=float(logits.std()))
        # feature checks: each exercised piece changes the output
        chk = copy.deepcopy(ref)
        for layer in chk.model.layers:
            c = layer.self_attn.compressor
            if c is not None and hasattr(c, "indexer"):
                c.indexer.index_topk = 10 ** 6
        checks["indexer_topk_all_max_abs_logit_change"] = float((chk(ids, use_cache=False).logits[0] - logits).abs().max())
        chk = copy.deepcopy(ref)
        for layer in chk.model.layers:
            layer.self_attn.sinks.zero_().add_(-1e4)
        checks["sinks_off_max_abs_logit_change"] = float((chk(ids, use_cache=False).logits[0] - logits).abs().max())
    refj = {"prompt_ids": prompt, "logits": r8(logits.tolist()), "greedy_ids": greedy_ids, "checks": checks,
            "transformers_version": __import__("transformers").__version__, "torch_version": torch.__version__,
            "device": device, "attn_implementation": "eager",
            "dtype_note": ("dense linears F8_E4M3 + E8M0 128x128 .scale, routed experts FP4 e2m1 (I8, two per byte, "
                           "low nibble first) + E8M0 .scale per 32 along K, embed/head/router/compressor BF16, "
                           "hc/sinks/ape/norms/bias F32; reference = transformers fp32 on the DEQUANTIZED values")
            if fx["quant"] else "BF16 linears, F32 hc/sinks/position_bias/norms/bias; reference = transformers fp32",
            "naming": "DeepSeek (layers.N.attn.*, ffn.experts.E.w1/w2/w3)" if fx["spelling"] == "official"
            else "transformers (model.layers.N.self_attn.*, fused mlp.experts.gate_up_proj)",
            "greedy_note": f"{fx['gen_len']} greedy tokens, no EOS, argmax of fp32 logits recomputed without cache"}
    with open(os.path.join(fdir, "reference.json"), "w") as f:
        json.dump(refj, f)
    size = sum(os.path.getsize(os.path.join(fdir, x)) for x in os.listdir(fdir))
    assert size <= 2 * 1024 * 1024, f"{name} is {size} bytes > 2 MB"
    s = f"[golden] {name}: {size / 1024:.0f} KiB, {checks} ({time.time() - t0:.1f}s)"
    print(s, flush=True)
    return {"name": name, "bytes": size, "summary": s}
