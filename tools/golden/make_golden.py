#!/usr/bin/env python3
"""Golden fixtures for deepinfer: tiny random DeepSeek checkpoints + HF transformers reference outputs.

Usage: python tools/golden/make_golden.py --out DIR [--device cuda|cpu] [--only NAME ...]

Writes DIR/<name>/{config.json, model.safetensors, reference.json} for each fixture:
  v3_tiny       deepseek_v3, q_lora, n_group 4 / topk_group 2, sigmoid + noaux_tc, nonzero bias, shared expert,
                rope_interleave, plain rope, MTP layer weights, FUSED transformers-5 expert layout, bf16,
                config in transformers-5 spelling (rope_parameters).
  v2_lite_tiny  deepseek_v2, q_lora_rank null, softmax + greedy top-k, 2 shared experts, per-expert layout,
                bf16, config in official spelling (rope_theta + rope_scaling null).
  v3_fp8_yarn   deepseek_v3, YaRN rope (official rope_scaling spelling), F8_E4M3 linear weights with 128x128
                `_scale_inv` blocks (partial blocks: hidden 192, moe_intermediate 96, ...), n_group 1,
                per-expert layout, quantization_config as DeepSeek ships.
  v32_tiny      deepseek_v32 (DeepSeek sparse attention): lightning indexer with 16 heads x 32 (rope 16),
                index_topk 8 and a 24-token prompt (top-k drops positions from query 8 on), per-expert layout,
                BF16, official config spelling.
  v32_fp8       deepseek_v32 with F8_E4M3 weights and ue8m0 (power-of-two) 128x128 scales
                (`scale_fmt: ue8m0`), indexer wq_b/wk FP8, weights_proj BF16, k_norm F32; index_topk 12,
                20-token prompt, partial blocks (hidden 192, q_lora 160, indexer 16 x 32 = 512 rows).
The reference is always computed by transformers in float32 from exactly the weights stored on disk
(bf16 upcast, or fp8 x block scale), re-loaded from the written files.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsutil  # noqa: E402

import transformers  # noqa: E402
transformers.logging.set_verbosity_error()  # the MTP-weights "UNEXPECTED" load reports are expected
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,  # noqa: E402
                          DeepseekV3ForCausalLM, DeepseekV32Config, DeepseekV32ForCausalLM)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer  # noqa: E402

PROMPT_LEN = 12
GEN_LEN = 32

FIXTURES = {
    "v3_tiny": dict(
        seed=1001, arch="v3", layout="fused", fp8=False, spelling="hf", mtp=True,
        cfg=dict(vocab_size=512, hidden_size=128, intermediate_size=192, moe_intermediate_size=32,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                 n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=64, q_lora_rank=96,
                 qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, n_group=4, topk_group=2,
                 num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=256,
                 rms_norm_eps=1e-6, rope_interleave=True, num_nextn_predict_layers=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 topk_method="noaux_tc", scoring_func="sigmoid"),
    ),
    "v2_lite_tiny": dict(
        seed=2002, arch="v2", layout="per_expert", fp8=False, spelling="official", mtp=False,
        rope_theta=10000.0, rope_scaling=None,
        cfg=dict(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=32,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2,
                 n_routed_experts=8, routed_scaling_factor=1.5, kv_lora_rank=64, q_lora_rank=None,
                 qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, n_group=1, topk_group=1,
                 num_experts_per_tok=3, first_k_dense_replace=1, norm_topk_prob=False, topk_method="greedy",
                 max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
                 scoring_func="softmax"),
    ),
    "v3_fp8_yarn": dict(
        seed=3003, arch="v3", layout="per_expert", fp8=True, spelling="official", mtp=False,
        rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
        cfg=dict(vocab_size=512, hidden_size=192, intermediate_size=320, moe_intermediate_size=96,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                 n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=96, q_lora_rank=160,
                 qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32, n_group=1, topk_group=1,
                 num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=64,
                 rms_norm_eps=1e-6, rope_interleave=True, num_nextn_predict_layers=0,
                 topk_method="noaux_tc", scoring_func="sigmoid"),
    ),
}

# DeepSeek-V3.2 tiny configs: 16 indexer heads (MODELS.md pitfall: with very few heads many keys score
# exactly 0 after the ReLU and tie at the cut), prompts longer than index_topk.
_V32_COMMON = dict(vocab_size=512, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                   n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                   num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
                   max_position_embeddings=128, rms_norm_eps=1e-6, num_nextn_predict_layers=0,
                   index_n_heads=16, topk_method="noaux_tc", scoring_func="sigmoid")
FIXTURES["v32_tiny"] = dict(
    seed=4008, arch="v32", layout="per_expert", fp8=False, spelling="official", mtp=False, prompt_len=24,
    rope_theta=10000.0, rope_scaling=None,
    cfg=dict(_V32_COMMON, hidden_size=128, intermediate_size=192, moe_intermediate_size=32, kv_lora_rank=64,
             q_lora_rank=96, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=32, index_head_dim=32,
             index_topk=8),
)
FIXTURES["v32_fp8"] = dict(
    seed=5005, arch="v32", layout="per_expert", fp8=True, ue8m0=True, spelling="official", mtp=False,
    prompt_len=20, rope_theta=10000.0, f32_suffixes=("indexer.k_norm.weight", "indexer.k_norm.bias"),
    # YaRN as V3.2 ships it (mscale == mscale_all_dim, so cos/sin are unscaled in transformers and in
    # DeepSeek's reference alike; the indexer's RoPE uses the same table).
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    cfg=dict(_V32_COMMON, num_hidden_layers=2, hidden_size=192, intermediate_size=320, moe_intermediate_size=96,
             kv_lora_rank=96, q_lora_rank=160, qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32,
             index_head_dim=32, index_topk=12, max_position_embeddings=64),
)

QUANT_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]}

# keys that are official DeepSeek config fields but not transformers constructor args
_OFFICIAL_ONLY = ("topk_method", "scoring_func")


def log(*a):
    print(*a, flush=True)


def hf_config(fx: dict):
    kw = {k: v for k, v in fx["cfg"].items() if k not in _OFFICIAL_ONLY or fx["arch"] == "v2"}
    kw.pop("scoring_func", None)
    if fx["arch"] in ("v3", "v32"):
        kw.pop("topk_method", None)
        if fx["spelling"] == "official":
            rp = {"rope_type": "default", "rope_theta": fx["rope_theta"]}
            if fx.get("rope_scaling"):
                rp = dict(fx["rope_scaling"])
                rp["rope_type"] = rp.pop("type")
                rp["rope_theta"] = fx["rope_theta"]
            kw["rope_parameters"] = rp
        return DeepseekV32Config(**kw) if fx["arch"] == "v32" else DeepseekV3Config(**kw)
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": fx["rope_theta"]}
    return DeepseekV2Config(**kw)


def init_params(named, gen: torch.Generator, hidden: int):
    """Deterministic random init with O(1) activations (HF's 0.02 init makes near-uniform logits)."""
    for name, p in named:
        shape = p.shape
        if name.endswith("e_score_correction_bias"):
            v = 0.15 * torch.randn(shape, generator=gen)
        elif name.endswith("k_norm.bias"):  # V3.2 indexer LayerNorm bias
            v = 0.1 * torch.randn(shape, generator=gen)
        elif "norm" in name:
            v = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif "embed_tokens" in name:
            v = torch.randn(shape, generator=gen)
        elif name == "lm_head.weight":
            v = torch.randn(shape, generator=gen) * (2.5 / math.sqrt(shape[-1]))
        elif name.endswith("mlp.gate.weight"):
            v = torch.randn(shape, generator=gen) * (1.5 / math.sqrt(shape[-1]))
        else:  # linear [out, in] or fused experts [E, out, in]
            v = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        with torch.no_grad():
            p.copy_(v.to(p.dtype))


def named_tensors(module, prefix=""):
    out = [(prefix + n, p) for n, p in module.named_parameters()]
    out += [(prefix + n, b) for n, b in module.named_buffers() if n.endswith("e_score_correction_bias")]
    return sorted(out, key=lambda x: x[0])


def make_mtp_weights(cfg, gen, n_layer: int) -> dict:
    """Random V3 MTP layer in DeepSeek naming at layer id num_hidden_layers (block weights directly under
    model.layers.{N}.*, plus enorm/hnorm/eh_proj/shared_head.norm; embed/head shared, not stored)."""
    c = copy.deepcopy(cfg)
    c.first_k_dense_replace = 0
    block = DeepseekV3DecoderLayer(c, n_layer)
    H = cfg.hidden_size
    extra = {"enorm.weight": torch.empty(H), "hnorm.weight": torch.empty(H),
             "eh_proj.weight": torch.empty(H, 2 * H), "shared_head.norm.weight": torch.empty(H)}
    items = named_tensors(block) + sorted(extra.items())
    init_params(items, gen, H)
    pre = f"model.layers.{n_layer}."
    return {pre + n: t.detach().clone() for n, t in items}


def to_disk_dtypes(sd: dict, fp8: bool, ue8m0: bool = False, f32_suffixes: tuple = ()) -> dict:
    if fp8:
        return dsutil.quantize_state_dict(sd, ue8m0=ue8m0, f32_suffixes=f32_suffixes)
    out = {}
    for k, v in sd.items():
        v = v.detach().cpu()
        out[k] = v.float().contiguous() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16).contiguous()
    return out


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, device):
    ids = list(prompt)
    gaps = []
    for _ in range(n):
        logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0, -1].float().cpu()
        top2 = torch.topk(logits, 2).values
        gaps.append(float(top2[0] - top2[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], min(gaps)


def r8(rows):
    return [[float(f"{x:.8g}") for x in row] for row in rows]


def mtp_reference(model, fixture_dir, prompt, n_layer, device):
    """MTP logits from transformers' own MtpModel (5.17). Row i: draft logits for token i+2 from
    h_i (main model last hidden state at position i, AFTER model.norm) and embed(prompt[i+1])."""
    from transformers.modeling_layers import MtpModel
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n_layer}\..*"]
    mtp = MtpModel.from_pretrained(model, device_map={"": device}).float().eval()
    ids = torch.tensor([prompt], device=device)
    out = model(ids, output_hidden_states=True, use_cache=False)
    h = out.hidden_states[-1]
    assert torch.equal(h, model.model(ids).last_hidden_state), "hidden_states[-1] is not post-norm"
    rows = []
    L = len(prompt)
    for i in range(L - 1):
        _, cand_logits, _ = mtp(input_ids=ids[:, 1:i + 2], last_hidden_states=h[:, :i + 1],
                                attention_mask=torch.ones(1, i + 1, dtype=torch.long, device=device),
                                position_ids=torch.arange(1, i + 2, device=device)[None], mtp_cache=None)
        rows.append(cand_logits[0, -1].float().cpu().tolist())
    return rows


@torch.no_grad()
def indexer_cut_gaps(model, ids, topk: int):
    """V3.2: over every layer and every query row whose causal context exceeds index_topk, the gap between
    the topk-th and (topk+1)-th best index scores relative to the row's max |score| (small = a near-tie at
    the cut, where the kept set would depend on the top-k implementation). Scores recomputed from the
    indexer's inputs by its formula; the kept set is checked equal to what the indexer returned.
    Returns (min relative gap, rows that drop positions)."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    gaps, rows, hooks = [], [0], []

    def hook(ix, args, out):
        hs, q_resid, (cos, sin) = args[0], args[1], args[2]
        B, S, _ = hs.shape
        q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
        r = ix.qk_rope_head_dim
        k = ix.k_norm(ix.wk(hs)).unsqueeze(2)
        q_rot, k_rot = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., r:]], -1).float()
        k = torch.cat([k_rot, k[..., r:]], -1).squeeze(2).float()
        w = ix.weights_proj(hs).float() * ix.n_heads ** -0.5                       # [B, S, H]
        sc = torch.relu(torch.einsum("bshd,btd->bsht", q, k) * ix.softmax_scale)  # [B, S, H, T]
        idx = torch.einsum("bsh,bsht->bst", w, sc)[0]                            # [S, T]
        for t in range(S):
            if t + 1 <= topk:
                continue
            v, order = torch.sort(idx[t, :t + 1], descending=True)
            gaps.append(float((v[topk - 1] - v[topk]) / v.abs().max()))
            rows[0] += 1
            assert set(order[:topk].tolist()) == set(out[0, t].tolist()), "indexer recomputation disagrees"

    for layer in model.model.layers:
        hooks.append(layer.self_attn.indexer.register_forward_hook(hook))
    try:
        model(ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return min(gaps), rows[0]


def build_fixture(name: str, fx: dict, out_root: str, device: str) -> dict:
    t0 = time.time()
    fdir = os.path.join(out_root, name)
    os.makedirs(fdir, exist_ok=True)
    cfg = hf_config(fx)
    cfg._attn_implementation = "eager"
    torch.manual_seed(fx["seed"])
    gen = torch.Generator().manual_seed(fx["seed"])
    Model = {"v3": DeepseekV3ForCausalLM, "v2": DeepseekV2ForCausalLM, "v32": DeepseekV32ForCausalLM}[fx["arch"]]
    plen = fx.get("prompt_len", PROMPT_LEN)
    model = Model(cfg).float()
    init_params(named_tensors(model), gen, cfg.hidden_size)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # keep only real checkpoint tensors (buffers like rotary inv_freq are non-persistent already)
    if "lm_head.weight" not in sd:
        raise RuntimeError("lm_head missing")
    n_layer = cfg.num_hidden_layers
    if fx["mtp"]:
        sd.update(make_mtp_weights(cfg, gen, n_layer))
    n_experts = cfg.n_routed_experts
    # in-memory model state dict uses the fused layout; convert as requested
    sd_pe = dsutil.unfuse_experts(sd)
    disk = to_disk_dtypes(sd_pe, fx["fp8"], fx.get("ue8m0", False), fx.get("f32_suffixes", ()))
    if fx["layout"] == "fused":
        disk = dsutil.fuse_experts(disk, n_experts)
    disk = dict(sorted(disk.items()))
    save_file(disk, os.path.join(fdir, "model.safetensors"), metadata={"format": "pt"})

    # ---- config.json
    if fx["spelling"] == "hf":
        cfg_d = cfg.to_dict()
        for k in ("_attn_implementation_autoset", "_name_or_path"):
            cfg_d.pop(k, None)
        cfg_d["architectures"] = ["DeepseekV3ForCausalLM"]
        cfg_d["dtype"] = "bfloat16"
        cfg_d["topk_method"] = fx["cfg"].get("topk_method")
        cfg_d["scoring_func"] = fx["cfg"].get("scoring_func")
    else:
        base = cfg.to_dict()
        base["architectures"] = [Model.__name__]
        extra = {"topk_method": fx["cfg"]["topk_method"], "scoring_func": fx["cfg"]["scoring_func"]}
        if fx["fp8"]:
            extra["quantization_config"] = dict(QUANT_CONFIG)
            if fx.get("ue8m0"):
                extra["quantization_config"]["scale_fmt"] = "ue8m0"
        if fx["arch"] == "v32":  # official V3.2 configs derive these from first_k_dense_replace
            base.pop("mlp_layer_types", None)
            base.pop("layer_types", None)
        cfg_d = dsutil.official_config(base, fx["rope_theta"], fx.get("rope_scaling"), extra)
    cfg_d.pop("_attn_implementation", None)
    cfg_d.pop("attn_implementation", None)
    dsutil.write_json(os.path.join(fdir, "config.json"), cfg_d, indent=2)

    # ---- reload exactly what is on disk, upcast / dequantize to fp32
    disk_back = load_file(os.path.join(fdir, "model.safetensors"))
    w32 = dsutil.dequantize_state_dict(disk_back)
    for k, v in disk_back.items():
        if k.endswith("e_score_correction_bias"):
            assert v.dtype == torch.float32
    if fx["fp8"]:
        # HF cannot run block-fp8 on CPU: hand it the dequantized fp32 weights with a de-quantized config
        tmp = tempfile.mkdtemp(prefix=f"golden_{name}_")
        d2 = dict(cfg_d)
        d2.pop("quantization_config")
        dsutil.write_json(os.path.join(tmp, "config.json"), d2, indent=2)
        save_file({k: v.contiguous() for k, v in w32.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        load_dir = tmp
    else:
        load_dir = fdir
    ref_model = Model.from_pretrained(load_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
    rp = ref_model.config.rope_parameters
    # the loaded config must reproduce what we intended (official spelling parsed correctly)
    if fx.get("rope_scaling"):
        assert rp["rope_type"] == "yarn" and rp["factor"] == fx["rope_scaling"]["factor"], rp
        assert rp["mscale_all_dim"] == fx["rope_scaling"]["mscale_all_dim"], rp

    # cross-check: in-memory model with the same (rounded) weights gives identical logits
    chk = Model(copy.deepcopy(ref_model.config)).float()
    main_w = {k: v for k, v in w32.items() if not k.startswith(f"model.layers.{n_layer}.")}
    missing, unexpected = chk.load_state_dict(dsutil.fuse_experts(main_w, n_experts), strict=False)
    missing = [m for m in missing if "rotary" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    chk = chk.to(device).eval()

    pgen = torch.Generator().manual_seed(fx["seed"] + 7)
    prompt = torch.randint(3, cfg.vocab_size, (plen,), generator=pgen).tolist()
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        logits = ref_model(ids, use_cache=False).logits[0].float().cpu()
        logits_chk = chk(ids, use_cache=False).logits[0].float().cpu()
        load_diff = float((logits - logits_chk).abs().max())
        assert load_diff < 1e-4, f"{name}: from_pretrained vs load_state_dict differ by {load_diff}"
        greedy_ids, min_gap = greedy(ref_model, prompt, GEN_LEN, device)
        # generate() with KV cache must agree with the no-cache loop
        gen_ids = ref_model.generate(ids, max_new_tokens=GEN_LEN, min_new_tokens=GEN_LEN, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, plen:].tolist()
        checks = {"load_path_max_abs_diff": load_diff, "generate_with_cache_matches": gen_ids == greedy_ids,
                  "min_top1_top2_gap_greedy": min_gap,
                  "logit_std": float(logits.std())}
        # feature checks: the exercised feature must change the output
        if fx["arch"] == "v32":
            topk = cfg.index_topk
            full = torch.tensor([prompt + greedy_ids[:-1]], device=device)
            checks["min_indexer_cut_gap_relative"], checks["indexer_rows_dropping_positions"] = \
                indexer_cut_gaps(ref_model, full, topk)
            assert checks["min_indexer_cut_gap_relative"] > 1e-4, f"{name}: near-tie at the top-k cut {checks}"
            for layer in chk.model.layers:  # dense attention (every causal position kept)
                layer.self_attn.indexer.index_topk = 1 << 30
            checks["dense_attention_max_abs_logit_change"] = float(
                (chk(ids, use_cache=False).logits[0].float().cpu() - logits).abs().max())
            for layer in chk.model.layers:
                layer.self_attn.indexer.index_topk = topk
        if fx["arch"] in ("v3", "v32"):
            for layer in chk.model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.e_score_correction_bias.zero_()
            checks["bias_zeroed_max_abs_logit_change"] = float(
                (chk(ids, use_cache=False).logits[0].float().cpu() - logits).abs().max())
        if fx.get("rope_scaling"):
            c2 = copy.deepcopy(ref_model.config)
            c2.rope_parameters = {"rope_type": "default", "rope_theta": fx["rope_theta"]}
            plain = Model(c2).float()
            plain.load_state_dict(ref_model.state_dict(), strict=False)
            plain = plain.to(device).eval()
            checks["plain_rope_max_abs_logit_change"] = float(
                (plain(ids, use_cache=False).logits[0].float().cpu() - logits).abs().max())

    ref = {
        "prompt_ids": prompt,
        **({"index_topk": cfg.index_topk,
            "indexer_note": ("transformers 5.17 deepseek_v32 (eager): score(t, s) = sum_h w[t, h] * ReLU(q[t, h] . k[s] "
                             "* index_head_dim^-0.5), w = weights_proj(x) * index_n_heads^-0.5, causal, top "
                             "min(index_topk, context) positions kept; no Hadamard / FP8 simulation of the indexer "
                             "q/k (DeepSeek's reference quantizes them); checks.min_indexer_cut_gap_relative is "
                             "the smallest margin at the cut over all layers and rows of prompt + greedy")}
           if fx["arch"] == "v32" else {}),
        "logits": r8(logits.tolist()),
        "greedy_ids": greedy_ids,
        "dtype_note": ("weights stored F8_E4M3 + F32 128x128 *_scale_inv (norms/embed/lm_head/router gate BF16, "
                       + ("scales are powers of two (ue8m0), indexer wq_b/wk FP8, weights_proj BF16, k_norm F32, "
                          if fx.get("ue8m0") else "") +
                       "e_score_correction_bias F32); reference = transformers fp32 forward on the DEQUANTIZED "
                       "weights (fp8 value x block scale_inv)") if fx["fp8"] else
                      ("weights stored BF16 (e_score_correction_bias F32); reference = transformers fp32 forward "
                       "on exactly those values upcast to fp32"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": device,
        "attn_implementation": "eager",
        "expert_layout": ("fused transformers-5: mlp.experts.gate_up_proj [E, 2*I, H] (rows 0..I-1 = gate, I..2I-1 = up) "
                          "and mlp.experts.down_proj [E, H, I]. NOTE: transformers 5.17 save_pretrained itself "
                          "writes the per-expert layout; this fixture writes fused on purpose so loaders cover it")
        if fx["layout"] == "fused" else "per-expert (official): mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight",
        "config_spelling": "transformers-5 (rope_parameters)" if fx["spelling"] == "hf"
        else "official (rope_theta + rope_scaling)",
        "greedy_note": f"{GEN_LEN} greedy tokens after the prompt, no EOS stopping, argmax of fp32 logits, "
                       "recomputed without cache each step (checked equal to generate() with cache)",
        "checks": checks,
    }
    if fx["mtp"]:
        ref["mtp_logits"] = r8(mtp_reference(ref_model, fdir, prompt, n_layer, device))
        ref["mtp_note"] = ("mtp_logits[i] (i = 0..len(prompt)-2) = transformers MtpModel logits drafting token i+2: "
                           "x = eh_proj(cat[enorm(embed(prompt[i+1])), hnorm(h_i)]) (EMBEDDING FIRST), h_i = main "
                           "model final hidden state at position i AFTER model.norm; x -> one decoder block "
                           "(MoE, causal over MTP positions 0..i, rope positions i+1 — relative so any consistent "
                           "offset works) -> shared_head.norm -> lm_head (shared).")
    if fx["fp8"]:
        ref["quantization"] = ("block 128x128: s = amax(|w_block|)/448, q = fp8_e4m3(w/s), *_scale_inv = s; "
                               "partial edge blocks use the same rule on their valid region")
    dsutil.write_json(os.path.join(fdir, "reference.json"), ref)
    size = dsutil.dir_size(fdir)
    assert size <= 2 * 1024 * 1024, f"{name} is {size} bytes > 2 MB"
    s = (f"[golden] {name}: {size / 1024:.0f} KiB, {len(disk)} tensors, prompt {plen} + greedy {GEN_LEN}, "
         f"min gap {min_gap:.3g}, cache-gen-match {checks['generate_with_cache_matches']}, "
         f"{', '.join(f'{k}={v:.3g}' for k, v in checks.items() if 'change' in k or 'indexer' in k)}"
         f"{', mtp rows ' + str(len(ref['mtp_logits'])) if fx['mtp'] else ''}  ({time.time() - t0:.1f}s)")
    log(s)
    return {"name": name, "bytes": size, "summary": s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if a.device == "cuda" and not torch.cuda.is_available():
        log("[golden] cuda requested but unavailable -> cpu")
        a.device = "cpu"
    os.makedirs(a.out, exist_ok=True)
    res = [build_fixture(n, fx, a.out, a.device) for n, fx in FIXTURES.items() if not a.only or n in a.only]
    import v4_golden  # DeepSeek-V4 fixtures (v4_golden.py; CPU, fp32)
    res += [v4_golden.build_v4_fixture(n, fx, a.out) for n, fx in v4_golden.V4_FIXTURES.items()
            if not a.only or n in a.only]
    for r in res:
        print(r["summary"])


if __name__ == "__main__":
    main()
