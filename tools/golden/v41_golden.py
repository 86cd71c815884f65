"""DeepSeek-V4.1 golden fixtures: a tiny random checkpoint and the reference outputs of the V4.1 oracle.

THE ORACLE IS UNMERGED PR CODE: transformers' pull request "Add DeepSeek-V4.1 (deepseek_v41) text model"
(src/transformers/models/deepseek_v41/), in no transformers release. It is kept OUTSIDE this repository
(never committed here): pass the folder holding its package `deepseek_v41_pr` (configuration_ and
modeling_deepseek_v41.py, imports made absolute) with --oracle; it runs on a stock transformers (5.24
tested) + torch, on the CPU, fp32, eager.

  python tools/golden/v41_golden.py --oracle /work/oracle-v41 --out tests/golden/fixtures [--only v41_tiny]

  v41_tiny  composite config.json as the released checkpoint ships it (model_type deepseek_v41, the text
            model under text_config), weights under the PR's names (model.layers.N.attn.wq_a, ...,
            lm_head); BF16 linears, F32 hc / sinks / norms / router biases. 7 layers, every V4.1 layer kind:
              0  window only
              1  ratio 2, KV + index source          2  ratio 2, reads layer 1's entries and choice
              3  ratio 2, KV + index source (a second group of the same ratio)
              4  ratio 1, KV + index source, candidate source (top 3 blocks of 4)
              5  ratio 1, reads layer 4's entries and choice
              6  ratio 1, index source reusing layer 4's keys inside layer 4's candidate blocks
            window 8, index top 5, gate_temp 1.3, YaRN on the compressed layers, eps 1e-20; prompt 40
            tokens (5 windows, 20 ratio-2 entries, 40 ratio-1 entries), 32 greedy tokens decoded with the
            oracle's cache.
  v41_fp8_fp4  the same schedule as the released checkpoint stores it: DeepSeek names (layers.N.attn.wq_a,
            layers.N.ffn.experts.E.w1, embed, head, norm), quantization_config fp8 ue8m0 with 32x32 blocks at the
            top of the composite config; dense attention / shared-expert / indexer-query linears F8_E4M3 with
            E8M0 `.scale` per 32x32 block, routed experts FP4 e2m1 (I8, two per byte, low nibble first) with
            E8M0 `.scale` per 32 along K; Engram as v41_engram with FP8 tables (E8M0 `.scale` per row and 32
            channels, as the PR's DeepseekV41EngramEmbedding reads them); the reference runs on the DEQUANTIZED
            values; 16 greedy tokens.
  v41_engram  v41_tiny with Engram on layers 1 and 5 (ENGRAM below; BF16 tables) and 4 routed experts; the
            compressed token map of a word-level tokenizer whose tokens collapse under the PR's normalisation
            goes to engram_token_map.safetensors (tensor token_map, I32 [vocab]).

reference.json: prompt_ids, logits (every prompt position, one-shot prefill through the PR's cache),
greedy_ids, checks (chunked prefill vs one-shot, cached decode vs re-prefill, feature sensitivities, the
smallest top-1/top-2 logit gap along the greedy path, the smallest relative gap at any top-k cut of the
prompt's prefill: indexer entries, candidate blocks, experts; the script refuses one under 1e-5). The oracle needs its cache (use_cache): its no-cache
path concatenates every source's compressed entries into one list.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

import torch
from safetensors.torch import save_file

V41_FIXTURES = {
    "v41_tiny": dict(seed=4141, prompt_len=40, gen_len=32, quant=False),
    "v41_fp8_fp4": dict(seed=4242, prompt_len=40, gen_len=16, quant=True, engram=True),
    "v41_engram": dict(seed=4343, prompt_len=40, gen_len=24, quant=False, engram=True),
}
# v41_engram: the v41_tiny schedule with Engram on layers 1 and 5 (2- to 4-grams, 2 heads, 32-dim rows,
# bucket primes above 40: tables of ~290 rows), 4 routed experts (to stay under 2 MB).
ENGRAM = dict(engram_layer_ids=[1, 5], engram_vocab_size=40, engram_max_ngram_size=4, engram_n_heads=2,
              engram_head_dim=32, engram_pad_id=2, n_routed_experts=4)


def engram_tokenizer(vocab_size):
    """A word-level tokenizer of `vocab_size` tokens whose texts collapse under the PR's normalisation (case,
    accents, NFKC compatibility forms, whitespace runs), so the compressed map is not the identity."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "</s>", "<pad>", " ", "  ", "\t", "\n"]
    stems = ["the", "cafe", "fin", "ab", "x", "na\u00efve", "ok", "zed", "moe", "kv"]
    forms = [lambda w: w, lambda w: w.upper(), lambda w: " " + w, lambda w: w.capitalize(), lambda w: "  " + w.title(),
             lambda w: w.replace("e", "\u00e9").replace("fi", "\ufb01"), lambda w: w + "\u00a0"]
    for w in stems:
        for f in forms:
            t = f(w)
            if t not in words:
                words.append(t)
    i = 0
    while len(words) < vocab_size:
        t = f"w{i}" if i % 3 else f"W{i}"
        i += 1
        if t not in words:
            words.append(t)
    tok = Tokenizer(models.WordLevel(vocab={w: k for k, w in enumerate(words)}, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")

QUANT = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
         "weight_block_size": [32, 32]}
# Dense linears the released checkpoint ships FP8 (32x32 blocks, E8M0 scales); routed experts are FP4.
FP8_LINEARS = (".attn.wq_a.", ".attn.wq_b.", ".attn.wkv.", ".attn.wo_a.", ".attn.wo_b.", ".shared_experts.",
               ".attn.indexer.wq_b.")

TEXT = dict(vocab_size=256, hidden_size=64, num_hidden_layers=7, num_attention_heads=4, head_dim=64, q_lora_rank=32,
            qk_rope_head_dim=16, o_groups=2, o_lora_rank=16, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=1, index_n_heads=16, index_head_dim=32, index_topk=5,
            sliding_window=8, compress_ratios=[0, 2, 2, 2, 1, 1, 1], kv_source_layer_ids=[1, 3, 4],
            index_source_layer_ids=[1, 3, 4, 6], candidate_source_layer_id=4, candidate_topk_blocks=3,
            candidate_block_size=4, gate_temp=1.3, rms_norm_eps=1e-20, hc_mult=4, hc_sinkhorn_iters=20,
            hc_eps=1e-6, swiglu_limit=10.0, routed_scaling_factor=1.5, max_position_embeddings=512,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                          "beta_fast": 32, "beta_slow": 1},
            num_nextn_predict_layers=0, engram_layer_ids=[], bos_token_id=0, eos_token_id=1,
            tie_word_embeddings=False)

F32_KEYS = ("hc_attn_", "hc_ffn_", "attn_sink", "norm.weight", "gate.bias", "gate.bias_vl")


def init(model, gen):
    for name, p in sorted(model.named_parameters(), key=lambda x: x[0]):
        s = p.shape
        if name.endswith(("gate.bias", "gate.bias_vl")):
            v = 0.3 * torch.randn(s, generator=gen)
        elif name.endswith("attn_sink"):
            v = torch.randn(s, generator=gen)
        elif name.endswith(("hc_attn_base", "hc_ffn_base")):
            v = 0.5 * torch.randn(s, generator=gen)
        elif name.endswith(("hc_attn_scale", "hc_ffn_scale")):
            v = 1.0 + 0.1 * torch.randn(s, generator=gen)
        elif name.endswith(("engram.q_weight", "engram.k_weight")):
            v = 1.0 + 0.3 * torch.randn(s, generator=gen)
        elif name.endswith("engram.embed.weight"):
            v = torch.randn(s, generator=gen)
        elif "norm" in name:
            v = 1.0 + 0.2 * torch.randn(s, generator=gen)
        elif name == "model.embed.weight":
            v = torch.randn(s, generator=gen)
        elif name == "lm_head.weight":
            v = torch.randn(s, generator=gen) * (2.5 / math.sqrt(s[-1]))
        elif name.endswith("ffn.gate.weight"):
            v = torch.randn(s, generator=gen) * (1.5 / math.sqrt(s[-1]))
        else:  # linears [out, in], hc fn [mix, hc*H]
            v = torch.randn(s, generator=gen) / math.sqrt(s[-1])
        with torch.no_grad():
            p.copy_(v.to(p.dtype))


def released_name(k):
    return "head.weight" if k == "lm_head.weight" else k[len("model."):]


def quantize_released(disk, back):
    """The PR-named BF16/F32 state dict -> the released checkpoint's names and formats; `back` (PR names)
    gets the dequantized values the oracle runs on."""
    import v4_golden  # the FP8 block / FP4 e2m1 (de)quantizers of the V4 fixtures

    out = {}
    for k, v in disk.items():
        o = released_name(k)
        if o.endswith(".engram.embed.scale"):
            continue  # written with its table
        if o.endswith(".engram.embed.weight"):  # FP8 rows, an E8M0 scale per 32 channels (the PR's embedding)
            rows, cols = v.shape
            blocks = v.float().reshape(rows, cols // 32, 32)
            exps = v4_golden.e8m0_scale(blocks.abs().amax(-1), 448.0)
            q = (blocks / (2.0 ** (exps.float() - 127)).unsqueeze(-1)).to(torch.float8_e4m3fn)
            out[o], out[o[:-len(".weight")] + ".scale"] = q.reshape(rows, cols), exps.view(torch.float8_e8m0fnu)
            back[k] = (q.float() * (2.0 ** (exps.float() - 127)).unsqueeze(-1)).reshape(rows, cols)
            continue
        if ".ffn.experts." in o and o.endswith(".weight"):
            q, sc = v4_golden.fp4_quant(v.float())
            out[o], out[o[:-len(".weight")] + ".scale"] = q, sc
            back[k] = v4_golden.fp4_dequant(q, sc)
        elif o.endswith(".weight") and any(t in o for t in FP8_LINEARS):
            q, sc = v4_golden.fp8_quant(v.float(), block=32)
            out[o], out[o[:-len(".weight")] + ".scale"] = q, sc
            back[k] = v4_golden.fp8_dequant(q, sc, block=32)
        else:
            out[o] = v
    return out


class TopkMargins:
    """Records, for every torch.topk the oracle runs (indexer entries, candidate blocks, experts), the smallest
    gap between the k-th and the (k+1)-th finite value of a row relative to the row's max |value|: a near-tie
    there would make the kept set depend on the top-k implementation."""

    def __init__(self):
        self.smallest, self._orig = float("inf"), torch.Tensor.topk

    def __enter__(self):
        orig, me = self._orig, self

        def topk(t, k, *args, **kwargs):
            out = orig(t, k, *args, **kwargs)
            n = t.shape[-1] if t.dim() else 1
            if 0 < k < n and t.is_floating_point():
                rows = orig(t.detach().float(), k + 1, dim=-1).values.reshape(-1, k + 1)
                scale = t.detach().float().abs().masked_fill(~torch.isfinite(t.detach().float()), 0).reshape(
                    -1, n).amax(-1).clamp_min(1e-30)
                finite = torch.isfinite(rows[:, k]) & torch.isfinite(rows[:, k - 1])
                if finite.any():
                    gap = ((rows[:, k - 1] - rows[:, k]) / scale)[finite]
                    me.smallest = min(me.smallest, float(gap.min()))
            return out

        torch.Tensor.topk = topk
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self._orig


def r8(rows):
    return [[float(f"{x:.8g}") for x in row] for row in rows]


def build_v41_fixture(name, fx, out_root):
    from deepseek_v41_pr.configuration_deepseek_v41 import DeepseekV41TextConfig
    from deepseek_v41_pr.modeling_deepseek_v41 import DeepseekV41CSACache, DeepseekV41ForCausalLM
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    def make_cache(cfg):  # 5.24's DynamicCache(config=...) gives the PR's CSA cache layer no config
        cache = DynamicCache()
        cache.layers = [DeepseekV41CSACache(cfg) if t == "shared_compressed_attention"
                        else DynamicSlidingWindowLayer(sliding_window=cfg.sliding_window) for t in cfg.layer_types]
        return cache

    def prefill(model, cfg, ids, chunks=None):
        cache, out, done = make_cache(cfg), [], 0
        for n in (chunks or [len(ids)]):
            out.append(model(torch.tensor([ids[done:done + n]]), past_key_values=cache, use_cache=True).logits[0])
            done += n
        return torch.cat(out).float(), cache

    def greedy(model, cfg, prompt, n):
        logits, cache = prefill(model, cfg, prompt)
        ids, gaps, last = list(prompt), [], logits[-1]
        for _ in range(n):
            top2 = torch.topk(last, 2).values
            gaps.append(float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(last)))
            last = model(torch.tensor([[ids[-1]]]), past_key_values=cache, use_cache=True).logits[0, -1].float()
        return ids[len(prompt):], min(gaps)

    t0 = time.time()
    fdir = os.path.join(out_root, name)
    os.makedirs(fdir, exist_ok=True)
    text_cfg = dict(TEXT)
    tokenizer = None
    if fx.get("engram"):
        from deepseek_v41_pr.modeling_deepseek_v41 import EngramLayout, build_compressed_token_map

        text_cfg.update(ENGRAM)
        tokenizer = engram_tokenizer(text_cfg["vocab_size"])
        token_map, compressed = build_compressed_token_map(tokenizer)
        text_cfg["engram_compressed_vocab_size"] = compressed
        probe = DeepseekV41TextConfig(**dict(text_cfg, engram_num_embeddings=[0] * len(ENGRAM["engram_layer_ids"])))
        layout = EngramLayout.from_config(probe)
        text_cfg["engram_num_embeddings"] = [sum(p for per in layer for p in per) for layer in layout.primes]
    cfg = DeepseekV41TextConfig(**text_cfg)
    cfg._attn_implementation = "eager"
    torch.manual_seed(fx["seed"])
    gen = torch.Generator().manual_seed(fx["seed"])
    model = DeepseekV41ForCausalLM(cfg).float()
    init(model, gen)
    disk, back = {}, {}
    for k, v in model.state_dict().items():
        v = v.detach().float().contiguous()
        disk[k] = v if any(t in k for t in F32_KEYS) else v.to(torch.bfloat16).contiguous()
        back[k] = disk[k].float()
    if fx["quant"]:
        disk = quantize_released(disk, back)
    save_file(dict(sorted(disk.items())), os.path.join(fdir, "model.safetensors"), metadata={"format": "pt"})
    text = dict(text_cfg, model_type="deepseek_v41_text")
    top = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": text,
           "image_token_id": 129264, "tie_word_embeddings": False}
    if fx["quant"]:
        top["quantization_config"] = QUANT
    with open(os.path.join(fdir, "config.json"), "w") as f:
        json.dump(top, f, indent=2)
    # The oracle on exactly the stored values, fp32.
    ref = DeepseekV41ForCausalLM(copy.deepcopy(cfg)).float().eval()
    if tokenizer is not None:
        ref.model.bind_tokenizer(tokenizer)
        # The compressed token map, as a sidecar the engine reads (the released checkpoint has no such tensor:
        # the PR derives it from the tokenizer).
        save_file({"token_map": torch.tensor(token_map, dtype=torch.int32)},
                  os.path.join(fdir, "engram_token_map.safetensors"), metadata={"format": "pt"})
    missing, unexpected = ref.load_state_dict(back, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    pgen = torch.Generator().manual_seed(fx["seed"] + 7)
    prompt = torch.randint(3, cfg.vocab_size, (fx["prompt_len"],), generator=pgen).tolist()
    checks = {}
    with torch.no_grad(), TopkMargins() as margins:
        prefill(ref, cfg, prompt + [0])  # the margins of the prompt's rows (and one decode-like row)
    checks["min_topk_cut_gap_relative"] = margins.smallest
    with torch.no_grad():
        logits, _ = prefill(ref, cfg, prompt)
        chunked, _ = prefill(ref, cfg, prompt, [7, 1, 9, fx["prompt_len"] - 17])
        checks["chunked_prefill_max_abs_diff"] = float((chunked - logits).abs().max())
        greedy_ids, min_gap = greedy(ref, cfg, prompt, fx["gen_len"])
        full, _ = prefill(ref, cfg, prompt + greedy_ids)
        reprefill = [int(torch.argmax(full[len(prompt) - 1 + i])) for i in range(fx["gen_len"])]
        checks.update(greedy_matches_reprefill=reprefill == greedy_ids, min_top1_top2_gap_greedy=min_gap,
                      logit_std=float(logits.std()))

        def change(edit):
            chk = copy.deepcopy(ref)
            edit(chk)
            return float((prefill(chk, chk.config, prompt)[0] - logits).abs().max())

        def all_entries(m):
            for layer in m.model.layers:
                if layer.attn.indexer is not None:
                    layer.attn.indexer.index_topk = 10 ** 6
                    layer.attn.indexer.candidate_topk_blocks = 10 ** 6

        def no_candidates(m):
            for layer in m.model.layers:
                if layer.attn.indexer is not None:
                    layer.attn.indexer.uses_candidates = False

        def sinks_off(m):
            for layer in m.model.layers:
                layer.attn.attn_sink.data.fill_(-1e4)

        def gate_temp_one(m):
            for layer in m.model.layers:
                layer.ffn.gate.gate_temp = 1.0

        checks["indexer_all_entries_max_abs_logit_change"] = change(all_entries)
        checks["candidates_off_max_abs_logit_change"] = change(no_candidates)
        checks["sinks_off_max_abs_logit_change"] = change(sinks_off)
        checks["gate_temp_one_max_abs_logit_change"] = change(gate_temp_one)
        if tokenizer is not None:
            def engram_off(m):
                for layer in m.model.layers:
                    layer.engram = None

            checks["engram_off_max_abs_logit_change"] = change(engram_off)
    assert checks["chunked_prefill_max_abs_diff"] < 1e-4 and checks["greedy_matches_reprefill"], checks
    assert checks["min_topk_cut_gap_relative"] > 1e-5, f"a near-tie at a top-k cut: {checks}"
    refj = {"prompt_ids": prompt, "logits": r8(logits.tolist()), "greedy_ids": greedy_ids, "checks": checks,
            "oracle": "UNMERGED transformers PR 'Add DeepSeek-V4.1 (deepseek_v41) text model' "
                      "(src/transformers/models/deepseek_v41/, modeling at huggingface/transformers "
                      "0a2080b43eb64e6d448186a4f3f0bc9c618f4797), fp32, eager, CPU, through its cache",
            "transformers_version": __import__("transformers").__version__, "torch_version": torch.__version__,
            "dtype_note": ("dense linears F8_E4M3 + E8M0 32x32 .scale, routed experts FP4 e2m1 (I8) + E8M0 .scale per "
                           "32 along K, others BF16, hc/sinks/norms/router biases F32; reference = the oracle in fp32 "
                           "on the DEQUANTIZED values") if fx["quant"] else
                          "BF16 linears, F32 hc/sinks/norms/router biases; reference = the oracle in fp32 on the "
                          "stored values",
            "naming": ("the released checkpoint's (layers.N.attn.*, layers.N.ffn.experts.E.w1, embed, head)"
                       if fx["quant"] else
                       "the PR's transformers names (model.layers.N.attn.*, model.layers.N.ffn.experts.E.w1, lm_head)"),
            "greedy_note": f"{fx['gen_len']} greedy tokens, no EOS, decoded one at a time through the oracle's cache"}
    with open(os.path.join(fdir, "reference.json"), "w") as f:
        json.dump(refj, f)
    size = sum(os.path.getsize(os.path.join(fdir, x)) for x in os.listdir(fdir))
    assert size <= 2 * 1024 * 1024, f"{name} is {size} bytes > 2 MB"
    print(f"[golden] {name}: {size / 1024:.0f} KiB, {checks} ({time.time() - t0:.1f}s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oracle", required=True, help="folder holding the PR oracle's package deepseek_v41_pr")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    sys.path.insert(0, a.oracle)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, fx in V41_FIXTURES.items():
        if not a.only or name in a.only:
            build_v41_fixture(name, fx, a.out)


if __name__ == "__main__":
    main()
