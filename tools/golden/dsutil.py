"""Shared helpers for the DeepSeek golden-fixture and tiny-model scripts.

Only depends on torch / safetensors / transformers.  Used by tools/golden/make_golden.py and
tools/train_tiny/train.py (which puts this directory on sys.path).
"""
from __future__ import annotations

import json
import math
import os
import re

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = 128

# Linear weights that DeepSeek ships as FP8 (everything 2-D under a layer except the router gate).
_FP8_SUFFIXES = (
    "q_proj.weight", "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
    "kv_b_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
    "eh_proj.weight",
    # DeepSeek-V3.2's lightning indexer: wq_b and wk are FP8 (weights_proj stays BF16, as the
    # reference builds it with the default dtype).
    "indexer.wq_b.weight", "indexer.wk.weight",
)


def is_fp8_weight(name: str, t: torch.Tensor) -> bool:
    """True for the tensors DeepSeek stores as F8_E4M3 (+ `<name>_scale_inv`).

    Not quantized: embeddings, lm_head, all norms, the router `mlp.gate.weight`,
    `e_score_correction_bias`."""
    return t.dim() == 2 and name.startswith("model.layers.") and name.endswith(_FP8_SUFFIXES)


def fp8_quantize(w: torch.Tensor, block: int = BLOCK, ue8m0: bool = False):
    """DeepSeek block quantization: per 128x128 block s = amax/448, q = fp8(w/s).
    ue8m0 (V3.1/V3.2 `scale_fmt: ue8m0`): s rounded UP to a power of two, 2^ceil(log2(amax/448)),
    as DeepSeek's kernel.py fast_round_scale does (stored F32, exact).

    Returns (q float8_e4m3fn [out,in], scale_inv float32 [ceil(out/128), ceil(in/128)]).
    Dequantized weight = q.float() * scale_inv (broadcast over each block)."""
    w = w.detach().float().cpu()
    out_f, in_f = w.shape
    nb_o, nb_i = math.ceil(out_f / block), math.ceil(in_f / block)
    pad = torch.zeros(nb_o * block, nb_i * block)
    pad[:out_f, :in_f] = w
    blocks = pad.view(nb_o, block, nb_i, block)
    amax = blocks.abs().amax(dim=(1, 3))  # [nb_o, nb_i]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).float()
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(nb_o * block, nb_i * block)[:out_f, :in_f].contiguous().to(torch.float8_e4m3fn)
    return q, scale.contiguous()


def fp8_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    out_f, in_f = q.shape
    s = scale_inv.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return q.float() * s


def fuse_experts(sd: dict, n_experts: int) -> dict:
    """Per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` -> transformers-5 fused
    `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first, then up) and `mlp.experts.down_proj` [E, H, I]."""
    out, groups = {}, {}
    pat = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    for k, v in sd.items():
        m = pat.match(k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for prefix, g in groups.items():
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([g[(e, "gate_proj")], g[(e, "up_proj")]], 0) for e in range(n_experts)])
        out[prefix + ".down_proj"] = torch.stack([g[(e, "down_proj")] for e in range(n_experts)])
    return out


def unfuse_experts(sd: dict) -> dict:
    """Inverse of fuse_experts (fused transformers-5 names -> official per-expert names)."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            prefix = k[: -len(".gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{prefix}.{e}.up_proj.weight"] = v[e, inter:].contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            prefix = k[: -len(".down_proj")]
            for e in range(v.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def quantize_state_dict(sd: dict, ue8m0: bool = False, f32_suffixes: tuple = ()) -> dict:
    """bf16 for everything except: FP8 linear weights (+ F32 `_scale_inv`, powers of two when ue8m0),
    F32 e_score_correction_bias and names ending in f32_suffixes. Expects per-expert (official) names."""
    out = {}
    for k, v in sd.items():
        if k.endswith("e_score_correction_bias") or (f32_suffixes and k.endswith(f32_suffixes)):
            out[k] = v.detach().float().cpu().contiguous()
        elif is_fp8_weight(k, v):
            q, s = fp8_quantize(v, ue8m0=ue8m0)
            out[k] = q
            out[k + "_scale_inv"] = s
        else:
            out[k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    return out


def dequantize_state_dict(sd: dict) -> dict:
    """Inverse view of quantize_state_dict: fp32 tensors, `_scale_inv` folded in."""
    out = {}
    for k, v in sd.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            out[k] = fp8_dequantize(v, sd[k + "_scale_inv"])
        else:
            out[k] = v.float()
    return out


def official_config(hf_cfg_dict: dict, rope_theta: float, rope_scaling, extra: dict | None = None) -> dict:
    """Rewrite a transformers-5 config dict into the official DeepSeek spelling:
    `rope_theta` + `rope_scaling` (None or {type: yarn, ...}) instead of `rope_parameters`;
    drop derived/transformers-only keys."""
    d = dict(hf_cfg_dict)
    for k in ("rope_parameters", "head_dim", "qk_head_dim", "dtype", "torch_dtype", "transformers_version",
              "_name_or_path", "output_attentions", "output_hidden_states", "use_return_dict",
              "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
              "problem_type"):
        d.pop(k, None)
    d["rope_theta"] = rope_theta
    d["rope_scaling"] = rope_scaling
    d["torch_dtype"] = "bfloat16"
    if extra:
        d.update(extra)
    return d


def write_json(path, obj, indent=None):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def dir_size(path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
