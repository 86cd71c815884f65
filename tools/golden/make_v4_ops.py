#!/usr/bin/env python3
"""Op fixtures for DeepSeek-V4's CPU reference ops, computed by transformers 5.17's own modules.

Usage: python tools/golden/make_v4_ops.py --out tests/unit/deepseek_v4/data/v4_ops.safetensors

Every expected tensor comes from the oracle's module (modeling_deepseek_v4.py) run on small random inputs
in float32; the engine's ops (backend.h, DeepSeek-V4 block) are checked against them by
tests/unit/deepseek_v4/test_v4_ops.cpp. Intermediate values the ops produce (the compressor's pooled rows
before kv_norm, the indexer's inputs) are captured with forward hooks on the oracle's submodules.
"""
import argparse
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def quant_fixtures():
    n, k = 6, 64
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    exps = torch.randint(120, 134, (n, k // 32), dtype=torch.uint8)
    scales = exps.view(torch.float8_e8m0fnu)
    deq = E2M1[codes.long()] * scales.to(torch.float32).repeat_interleave(32, dim=1)
    # FP8 with E8M0 128x128 block scales, partial blocks (200 x 130)
    w = torch.randn(200, 130) * 3
    q = w.to(torch.float8_e4m3fn)
    sexp = torch.randint(122, 131, (2, 2), dtype=torch.uint8)
    s8 = sexp.view(torch.float8_e8m0fnu)
    deq8 = q.to(torch.float32) * s8.to(torch.float32).repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :130]
    return dict(fp4_packed=packed.view(torch.int8), fp4_scale=scales, fp4_dequant=deq,
                fp8_weight=q, fp8_scale=s8, fp8_dequant=deq8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(4004)
    out = {}
    H, T = 16, 5
    cfg = DeepseekV4Config(vocab_size=64, hidden_size=H, head_dim=32, num_attention_heads=4, q_lora_rank=24,
                           num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=12,
                           index_n_heads=16, index_head_dim=16, index_topk=3, sliding_window=4, o_groups=2,
                           o_lora_rank=8, partial_rotary_factor=0.25,
                           layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
                           compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})
    # --- hyper-connections
    hc = m.DeepseekV4HyperConnection(cfg)
    with torch.no_grad():
        hc.fn.normal_(0, 0.5); hc.base.normal_(0, 0.5); hc.scale.uniform_(0.5, 1.5)
    streams = torch.randn(1, T, 4, H)
    post, comb, collapsed = hc(streams)
    f = torch.randn(1, T, H)
    mixed = post.unsqueeze(-1) * f.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), streams)
    out.update(hc_streams=streams[0], hc_fn=hc.fn, hc_base=hc.base, hc_scale=hc.scale, hc_post=post[0],
               hc_comb=comb[0], hc_collapsed=collapsed[0], hc_f=f[0], hc_mixed=mixed[0])
    head = m.DeepseekV4HyperHead(cfg)
    with torch.no_grad():
        head.hc_fn.normal_(0, 0.5); head.hc_base.normal_(0, 0.5); head.hc_scale.fill_(0.7)
    out.update(head_fn=head.hc_fn, head_base=head.hc_base, head_scale=head.hc_scale, head_out=head(streams)[0])
    # --- routing
    router = m.DeepseekV4TopKRouter(cfg)
    with torch.no_grad():
        router.weight.normal_(0, 1.0); router.e_score_correction_bias.normal_(0, 0.5)
    x = torch.randn(1, T, H)
    logits, weights, idx = router(x)
    order = torch.argsort(weights, dim=-1, descending=True)  # slot order is free (sorted=False)
    out.update(route_x=x[0], route_gate=router.weight, route_bias=router.e_score_correction_bias,
               route_logits=logits, route_ids=idx.gather(1, order).int(), route_weights=weights.gather(1, order))
    hrouter = m.DeepseekV4HashRouter(cfg)
    with torch.no_grad():
        hrouter.weight.copy_(router.weight)
        hrouter.tid2eid.copy_(torch.stack([torch.randperm(8)[:3] for _ in range(64)]))
    ids = torch.randint(0, 64, (1, T))
    _, hweights, hidx = hrouter(x, ids)
    out.update(hash_token_ids=ids[0].int(), hash_tid2eid=hrouter.tid2eid.int(), hash_ids=hidx.int(),
               hash_weights=hweights)
    # --- routed experts with the SwiGLU clamp (weights large enough that the clamp acts)
    ex = m.DeepseekV4Experts(cfg)
    with torch.no_grad():
        ex.gate_up_proj.normal_(0, 3.0); ex.down_proj.normal_(0, 0.5)
    xe = torch.randn(T, H)
    y = ex(xe, idx, weights)
    gu = F.linear(xe, ex.gate_up_proj[0])
    out.update(exp_x=xe, exp_gate_up=ex.gate_up_proj, exp_down=ex.down_proj, exp_out=y,
               exp_clamp_fraction=torch.tensor([(gu.abs() > 10).float().mean().item()]),
               swiglu_in=gu, swiglu_out=ex._apply_gate(gu))
    # --- attention with sinks over a window + some compressed rows, via a mask
    heads, D, S = 4, 32, 9
    q = torch.randn(1, heads, T, D)
    kv = torch.randn(1, 1, S, D)
    mod = torch.nn.Module()
    mod.num_key_value_groups = heads
    mod.sinks = torch.nn.Parameter(torch.randn(heads))
    mod.training = False
    allowed = torch.rand(T, S) < 0.5
    allowed[:, 0] = True
    allowed[2] = False  # a query that sees no row: only the sink
    mask = torch.zeros(1, 1, T, S).masked_fill(~allowed, float("-inf"))
    attn, _ = m.eager_attention_forward(mod, q, kv, kv, mask, scaling=D ** -0.5)
    idx_rows = torch.full((T, S), -1, dtype=torch.int32)
    for t in range(T):
        sel = allowed[t].nonzero().flatten()
        idx_rows[t, :len(sel)] = sel.int()
    out.update(attn_q=q[0].transpose(0, 1).contiguous(), attn_kv=kv[0, 0], attn_sinks=mod.sinks,
               attn_indices=idx_rows, attn_out=attn[0])
    # --- compressors: pooled rows captured at kv_norm's input
    captured = {}

    def grab(name):
        def hook(module, inputs, output):
            captured[name] = inputs[0].detach().clone()
        return hook
    Tc = 21
    hs = torch.randn(1, Tc, H)
    qres = torch.randn(1, Tc, cfg.q_lora_rank)
    pos = torch.arange(Tc).unsqueeze(0)
    hca = m.DeepseekV4HCACompressor(cfg)
    with torch.no_grad():
        hca.position_bias.normal_(0, 1.0)
    hca.kv_norm.register_forward_hook(grab("hca"))
    hca(hs, qres, pos, None, 1)
    out.update(hca_kv=F.linear(hs[0], hca.kv_proj.weight), hca_gate=F.linear(hs[0], hca.gate_proj.weight),
               hca_ape=hca.position_bias, hca_pooled=captured["hca"][0])
    csa = m.DeepseekV4CSACompressor(cfg)
    with torch.no_grad():
        csa.position_bias.normal_(0, 1.0); csa.indexer.position_bias.normal_(0, 1.0)
        csa.indexer.scorer.weights_proj.weight.normal_(0, 1.0)
    csa.kv_norm.register_forward_hook(grab("csa"))

    def grab_scorer(module, inputs, output):
        captured["scorer"] = [t.detach().clone() for t in inputs]
    csa.indexer.scorer.register_forward_hook(grab_scorer)
    indexer_out = {}

    def grab_indexer(module, inputs, output):
        indexer_out["ids"] = output.detach().clone()
    csa.indexer.register_forward_hook(grab_indexer)
    csa(hs, qres, pos, None, 0)
    iq, ikeys, ihs = captured["scorer"]
    iw = F.linear(ihs[0], csa.indexer.scorer.weights_proj.weight)
    scores = csa.indexer.scorer(iq, ikeys, ihs)[0]
    out.update(csa_kv=F.linear(hs[0], csa.kv_proj.weight), csa_gate=F.linear(hs[0], csa.gate_proj.weight),
               csa_ape=csa.position_bias, csa_pooled=captured["csa"][0],
               idx_q=iq[0].contiguous(), idx_keys=ikeys[0].contiguous(), idx_weights=iw, idx_positions=pos[0].int(),
               idx_topk=indexer_out["ids"][0].int(), idx_scores=scores)
    # --- formats: FP4 e2m1 (two per byte, low nibble first) x E8M0 per 32 along K; FP8 e4m3 x E8M0 128x128
    out.update(quant_fixtures())
    out = {k: v.detach().contiguous() for k, v in out.items()}
    save_file(out, args.out)
    print("wrote", args.out, sum(v.numel() * v.element_size() for v in out.values()), "bytes;",
          "clamp fraction", out["exp_clamp_fraction"].item())


if __name__ == "__main__":
    main()
