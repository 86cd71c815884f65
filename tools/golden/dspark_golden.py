"""DeepSeek-V4.1 DSpark drafter fixture (tests/golden/fixtures/v41_dspark): a tiny random drafter and OUR
reference of its forward, in numpy on the CPU.

There is no oracle: the unmerged transformers PR (deepseek_v41) has the drafter's config only and ignores
`mtp.*` on load. This reference is written from the DSpark paper's description and DeepSpec's code
(deepseek-ai/DeepSpec: modeling/dspark/common.py create_noise_embed / create_dspark_attention_mask,
modeling/dspark/qwen3/modeling.py Qwen3DSparkAttention + _forward_backbone, modeling/dspark/markov_head.py
VanillaMarkov, eval/dspark/draft_ops.py), with the V4-specific pieces as SGLang's DeepSeek-V4 DSpark drafter
has them (models/deepseek_v4_dspark.py: V4 stages with compress_ratio 0, main_proj/main_norm on stage 0,
hc_head + norm + markov/confidence heads on the last stage, the tap = mean over hc streams). The block ops
(hyper-connections, sink attention, grouped output, sqrt-softplus MoE) follow MODELS.md's V4/V4.1
description. bench/NOTES.md "V4.1 DSpark drafter" lists what is decided where no source says.

  context rows   f = main_norm(main_proj(concat of tap features)); per stage s: rope(kv_norm(wkv_s(f)), pos)
  block          tokens [anchor, noise x (B-1)] at anchor_pos .. anchor_pos + B - 1, embedding copied to hc
                 streams; per stage: hc_pre -> attn_norm -> attention over [context rows at pos > p - W ;
                 the whole block] with sinks -> inverse rope -> grouped output -> hc_post; hc_pre -> ffn_norm
                 -> MoE -> hc_post; then hc_head -> h, norm -> head: base logits
  drafts         logits_i = base_i + markov_w2 @ markov_w1[prev_i], prev_1 = anchor, prev_i = draft_{i-1};
                 argmax
  confidence     sigmoid(proj @ [h_i ; markov_w1[prev_i]])

Run: python3 tools/golden/dspark_golden.py tests/golden/fixtures   (numpy only)
"""
from __future__ import annotations

import json
import os
import struct
import sys

import numpy as np

F = np.float32

CONFIG = {
    "model_type": "deepseek_v41_text",
    "num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 2, "head_dim": 32,
    "qk_rope_head_dim": 8, "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 16,
    "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4, "vocab_size": 64,
    "sliding_window": 8, "hc_mult": 2, "hc_sinkhorn_iters": 3, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "gate_temp": 1.25,
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5, "dspark_noise_token_id": 63, "dspark_target_layer_ids": [0, 1],
    "dspark_markov_rank": 8, "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 2,
}
SEED = 1905
CONTEXTS = [12, 3]  # context rows of the two blocks (the first one past the window)


def rms(x, w, eps):
    x = x.astype(F)
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + F(eps)) * w).astype(F)


def rope(x, pos, theta, rd, inverse=False):
    """x [T, ..., D]: rotate the last rd dims as interleaved pairs by the angle of pos[t]."""
    x = x.copy()
    d = x.shape[-1]
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, rd, 2, dtype=F) / F(rd)))).astype(F)
    ang = (pos.astype(F)[:, None] * inv[None, :]).astype(F)
    if inverse:
        ang = -ang
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd // 2,)
    c, s = np.cos(ang).reshape(shape).astype(F), np.sin(ang).reshape(shape).astype(F)
    a, b = x[..., d - rd::2].copy(), x[..., d - rd + 1::2].copy()
    x[..., d - rd::2] = a * c - b * s
    x[..., d - rd + 1::2] = a * s + b * c
    return x


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hc_mixes(streams, fn, base, scale, c):
    t, hc, h = streams.shape
    flat = streams.reshape(t, hc * h)
    flat = flat / np.sqrt((flat * flat).mean(-1, keepdims=True) + c["rms_norm_eps"])
    mix = flat @ fn.T
    eps = c["hc_eps"]
    pre = sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * sigmoid(mix[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (mix[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(t, hc, hc)
    comb = np.exp(comb - comb.max(-1, keepdims=True))
    comb = comb / comb.sum(-1, keepdims=True) + eps
    comb = comb / (comb.sum(1, keepdims=True) + eps)  # columns
    for _ in range(c["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(2, keepdims=True) + eps)  # rows
        comb = comb / (comb.sum(1, keepdims=True) + eps)
    return pre, post, comb


def hc_post(streams, f, post, comb):
    # out[t, k] = post[t, k] f[t] + sum_j comb[t, j, k] streams[t, j]
    return post[:, :, None] * f[:, None, :] + np.einsum("tjk,tjh->tkh", comb, streams)


def hc_head(streams, fn, base, scale, c):
    t, hc, h = streams.shape
    flat = streams.reshape(t, hc * h)
    flat = flat / np.sqrt((flat * flat).mean(-1, keepdims=True) + c["rms_norm_eps"])
    pre = sigmoid((flat @ fn.T) * scale[0] + base) + c["hc_eps"]
    return np.einsum("tk,tkh->th", pre, streams)


def moe(x, st, c):
    logits = x @ st["gate"].T
    scores = np.sqrt(np.log1p(np.exp(logits)))
    k = c["dspark_num_experts_per_tok"]
    out = np.zeros_like(x)
    lim = c["swiglu_limit"]

    def expert(v, w1, w3, w2):
        g, u = v @ w1.T, v @ w3.T
        g = np.minimum(g, lim)
        u = np.clip(u, -lim, lim)
        return ((g * sigmoid(g)) * u) @ w2.T

    for t in range(x.shape[0]):
        sel = scores[t] + st["gate_bias"]
        chosen = sorted(range(len(sel)), key=lambda e: (-sel[e], e))[:k]
        wsum = sum(scores[t][e] for e in chosen)
        for e in chosen:
            w = scores[t][e] / (wsum + 1e-20) * c["routed_scaling_factor"]
            out[t] += w * expert(x[t], *st["experts"][e])
        out[t] += expert(x[t], *st["shared"])
    return out


def attention(q, ctx, kv, sinks, anchor_pos, c):
    """q [B, heads, D] of one block, ctx [n, D] (positions anchor_pos - n ..), kv [B, D] the block's rows."""
    b_, heads, d = q.shape
    n, w = ctx.shape[0], c["sliding_window"]
    keys = np.concatenate([ctx, kv], 0)
    out = np.zeros_like(q)
    for i in range(b_):
        p = anchor_pos + i
        vis = [j for j in range(n) if anchor_pos - n + j > p - w] + [n + j for j in range(b_)]
        kk = keys[vis]
        for h in range(heads):
            lg = (kk @ q[i, h]) / np.sqrt(d)
            m = max(lg.max(), sinks[h])
            e = np.exp(lg - m)
            out[i, h] = (e[:, None] * kk).sum(0) / (e.sum() + np.exp(sinks[h] - m))
    return out


def grouped_output(a, wo_a, wo_b, c):
    t = a.shape[0]
    g, ol = c["o_groups"], c["o_lora_rank"]
    gin = a.shape[1] // g
    parts = [a[:, i * gin:(i + 1) * gin] @ wo_a[i * ol:(i + 1) * ol].T for i in range(g)]
    return np.concatenate(parts, 1) @ wo_b.T


def main(out_root):
    c = CONFIG
    rng = np.random.default_rng(SEED)
    H, hc, D, rd = c["hidden_size"], c["hc_mult"], c["head_dim"], c["qk_rope_head_dim"]
    heads, ql, V, I = c["num_attention_heads"], c["q_lora_rank"], c["vocab_size"], c["moe_intermediate_size"]
    E, r, S, B = c["dspark_n_routed_experts"], c["dspark_markov_rank"], c["num_nextn_predict_layers"], c["dspark_block_size"]
    taps = len(c["dspark_target_layer_ids"])
    eps = c["rms_norm_eps"]
    mixes = (2 + hc) * hc
    T = {}

    def u(name, shape, bound, offset=0.0):
        a = (rng.uniform(-bound, bound, size=shape) + offset).astype(F)
        T[name] = a
        return a

    def lin(name, n, k):
        return u(name + ".weight", (n, k), 1.0 / np.sqrt(k))

    u("embed.weight", (V, H), 1.0)
    lin("head", V, H)
    stages = []
    for s in range(S):
        p, a, f = f"mtp.{s}.", f"mtp.{s}.attn.", f"mtp.{s}.ffn."
        st = {"attn_norm": u(p + "attn_norm.weight", (H,), 0.1, 1.0), "ffn_norm": u(p + "ffn_norm.weight", (H,), 0.1, 1.0)}
        for site in ("attn", "ffn"):
            st["hc_" + site] = (u(p + f"hc_{site}_fn", (mixes, hc * H), np.sqrt(3.0 / (hc * H))),
                                u(p + f"hc_{site}_base", (mixes,), 0.5), u(p + f"hc_{site}_scale", (3,), 0.1, 1.0))
        st["wq_a"] = lin(a + "wq_a", ql, H)
        st["q_norm"] = u(a + "q_norm.weight", (ql,), 0.1, 1.0)
        st["wq_b"] = lin(a + "wq_b", heads * D, ql)
        st["wkv"] = lin(a + "wkv", D, H)
        st["kv_norm"] = u(a + "kv_norm.weight", (D,), 0.1, 1.0)
        st["wo_a"] = lin(a + "wo_a", c["o_groups"] * c["o_lora_rank"], heads * D // c["o_groups"])
        st["wo_b"] = lin(a + "wo_b", H, c["o_groups"] * c["o_lora_rank"])
        st["sinks"] = u(a + "attn_sink", (heads,), 1.0)
        gate = lin(f + "gate", E, H)
        st["gate"] = (gate.astype(np.float64) / c["gate_temp"]).astype(F)  # logits / gate_temp
        st["gate_bias"] = u(f + "gate.bias", (E,), 0.1)
        u(f + "gate.bias_vl", (E,), 0.1)
        st["experts"] = [(lin(f + f"experts.{e}.w1", I, H), lin(f + f"experts.{e}.w3", I, H), lin(f + f"experts.{e}.w2", H, I))
                         for e in range(E)]
        st["shared"] = (lin(f + "shared_experts.w1", I, H), lin(f + "shared_experts.w3", I, H),
                        lin(f + "shared_experts.w2", H, I))
        stages.append(st)
    main_proj = lin("mtp.0.main_proj", H, taps * H)
    main_norm = u("mtp.0.main_norm.weight", (H,), 0.1, 1.0)
    last = f"mtp.{S - 1}."
    head_fn = u(last + "hc_head_fn", (hc, hc * H), np.sqrt(3.0 / (hc * H)))
    head_base = u(last + "hc_head_base", (hc,), 0.5)
    head_scale = u(last + "hc_head_scale", (1,), 0.1, 1.0)
    norm = u(last + "norm.weight", (H,), 0.1, 1.0)
    w1 = u(last + "markov_head.markov_w1.weight", (V, r), 1.0)
    w2 = lin(last + "markov_head.markov_w2", V, r)
    conf = u(last + "confidence_head.proj.weight", (1, H + r), 2.0 / np.sqrt(H + r))
    embed, head = T["embed.weight"], T["head.weight"]

    # Inputs: each block's tap features (its context positions 0 .. n - 1) and anchor.
    ref = {}
    feats = [rng.normal(size=(n, taps * H)).astype(F) for n in CONTEXTS]
    anchors = [int(x) for x in rng.integers(0, V - 1, size=len(CONTEXTS))]
    ref["features"] = np.concatenate(feats, 0)
    ref["positions"] = np.concatenate([np.arange(n) for n in CONTEXTS]).astype(np.int32)
    ref["anchors"] = np.array(anchors, dtype=np.int32)

    # Context rows.
    ctx = []
    for k, n in enumerate(CONTEXTS):
        fused = rms(feats[k] @ main_proj.T, main_norm, eps)
        ctx.append([rope(rms(fused @ st["wkv"].T, st["kv_norm"], eps), np.arange(n), c["rope_theta"], rd) for st in stages])
    for s in range(S):
        ref[f"context_rows.{s}"] = np.concatenate([ctx[k][s] for k in range(len(CONTEXTS))], 0)

    # The block forward.
    base_all, drafts_all, conf_all = [], [], []
    for k, n in enumerate(CONTEXTS):
        pos = np.arange(n, n + B)
        toks = [anchors[k]] + [c["dspark_noise_token_id"]] * (B - 1)
        streams = np.repeat(embed[toks][:, None, :], hc, axis=1).astype(F)
        for s, st in enumerate(stages):
            pre, post, comb = hc_mixes(streams, *st["hc_attn"], c)
            x = rms(np.einsum("tk,tkh->th", pre, streams), st["attn_norm"], eps)
            q = (rms(x @ st["wq_a"].T, st["q_norm"], eps) @ st["wq_b"].T).reshape(B, heads, D)
            q = rope(q, pos, c["rope_theta"], rd)
            kv = rope(rms(x @ st["wkv"].T, st["kv_norm"], eps), pos, c["rope_theta"], rd)
            o = attention(q, ctx[k][s], kv, st["sinks"], n, c)
            o = rope(o, pos, c["rope_theta"], rd, inverse=True).reshape(B, heads * D)
            streams = hc_post(streams, grouped_output(o, st["wo_a"], st["wo_b"], c), post, comb)
            pre, post, comb = hc_mixes(streams, *st["hc_ffn"], c)
            x = rms(np.einsum("tk,tkh->th", pre, streams), st["ffn_norm"], eps)
            streams = hc_post(streams, moe(x, st, c), post, comb)
        h = hc_head(streams, head_fn, head_base, head_scale, c)
        base = rms(h, norm, eps) @ head.T
        prev, drafts, confs = anchors[k], [], []
        for i in range(B):
            e = w1[prev]
            lg = base[i] + w2 @ e
            top = np.sort(lg)[-2:]
            assert top[1] - top[0] > 1e-3, f"near tie at block {k} draft {i}: pick another seed"
            d = int(np.argmax(lg))
            confs.append(float(sigmoid(conf[0] @ np.concatenate([h[i], e]))))
            drafts.append(d)
            prev = d
        base_all.append(base)
        drafts_all.append(drafts)
        conf_all.append(confs)
    ref["base_logits"] = np.concatenate(base_all, 0).astype(F)
    ref["drafts"] = np.array(drafts_all, dtype=np.int32)
    ref["confidences"] = np.array(conf_all, dtype=F)

    out = os.path.join(out_root, "v41_dspark")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(c, fh, indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"), T)
    write_safetensors(os.path.join(out, "reference.safetensors"), ref)
    print("drafts", ref["drafts"].tolist(), "confidences", np.round(ref["confidences"], 4).tolist())


def write_safetensors(path, tensors):
    names = sorted(tensors)
    header, off, blobs = {}, 0, []
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[a.dtype]
        b = a.tobytes()
        header[n] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)))
        fh.write(h)
        for b in blobs:
            fh.write(b)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/fixtures")
