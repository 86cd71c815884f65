"""DeepSeek-V4 MTP golden fixture (fixtures/v4_mtp): a tiny V4 checkpoint with one MTP block (`mtp.0.*`,
DeepSeek's names) and reference MTP logits.

transformers 5.17 has no V4 MTP module (DeepseekV4ForCausalLM ignores `mtp.*`), so the reference is written
from the description of DeepSeek's V4 inference code (inference/model.py, MTPBlock; MODELS.md V4-Flash "MTP"):

    e      = enorm(embed(t_{i+1}))                 the main model's embedding
    x      = hnorm(h_i)                            h_i: the main model's hyper-connection streams after the
                                                   last layer, [hc, H] per token (before hc_head)
    x      = e_proj(e) (added to every stream) + h_proj(x)
    x      = Block(x)                              a full V4 block: window-only attention, non-hash MoE
    logits = head(norm(hc_head_mtp(x)))           its own hc_head_{fn,base,scale} and norm, the shared head

The block itself is transformers' DeepseekV4DecoderLayer: the oracle model is built with FOUR layers (0-2 the
main model, 3 sliding_attention + moe = the MTP block) and a forward pre-hook on layer 3 replaces its input by
e_proj(enorm(embed(t_{i+1}))) + h_proj(hnorm(h_i)); the MTP row of position i sits at position i (as the engine
places it). The checkpoint stores layers 0-2 under transformers' names and layer 3 as `mtp.0.*`.

fixtures/v4_mtp_hf holds the same values with the MTP block in transformers' spelling (model.mtp.0.*).

Run: /work/venv/bin/python tools/golden/v4_mtp_golden.py tests/golden/fixtures
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_golden as g  # noqa: E402

FX = dict(seed=4303, prompt_len=20, quant=False, spelling="hf",
          layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                       "sliding_attention"],
          rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
          mlp_layer_types=["hash_moe", "moe", "moe", "moe"])


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@torch.no_grad()
def main(out_root):
    fdir = os.path.join(out_root, "v4_mtp")
    os.makedirs(fdir, exist_ok=True)
    g.COMMON = dict(g.COMMON, num_hidden_layers=4)
    cfg = g.hf_config(FX)
    torch.manual_seed(FX["seed"])
    gen = torch.Generator().manual_seed(FX["seed"])
    model = DeepseekV4ForCausalLM(cfg).float()
    g.init(model, gen)
    H, hc, E, I = cfg.hidden_size, cfg.hc_mult, cfg.n_routed_experts, cfg.moe_intermediate_size
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    disk, back = g.to_disk(sd, FX, E)  # BF16 linears, F32 small tensors (back: the stored values)
    extra = {"e_proj.weight": torch.randn(H, H, generator=gen) / math.sqrt(H),
             "h_proj.weight": torch.randn(H, H, generator=gen) / math.sqrt(H),
             "enorm.weight": 1.0 + 0.2 * torch.randn(H, generator=gen),
             "hnorm.weight": 1.0 + 0.2 * torch.randn(H, generator=gen),
             "norm.weight": 1.0 + 0.2 * torch.randn(H, generator=gen),
             "hc_head_fn": torch.randn(hc, hc * H, generator=gen) / math.sqrt(hc * H),
             "hc_head_base": 0.5 * torch.randn(hc, generator=gen),
             "hc_head_scale": 1.0 + 0.1 * torch.randn(1, generator=gen)}
    out = {}
    for k, v in disk.items():
        if not k.startswith("model.layers.3."):
            out[k] = v
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            for e in range(E):
                out[f"mtp.0.ffn.experts.{e}.w1.weight"] = v[e, :I].contiguous()
                out[f"mtp.0.ffn.experts.{e}.w3.weight"] = v[e, I:].contiguous()
            continue
        if k.endswith("mlp.experts.down_proj"):
            for e in range(E):
                out[f"mtp.0.ffn.experts.{e}.w2.weight"] = v[e].contiguous()
            continue
        out["mtp.0." + g.official_name(k)[len("layers.3."):]] = v
    mtp = {}
    for k, v in extra.items():
        stored = v.to(torch.bfloat16) if k.endswith("proj.weight") else v.float()
        out["mtp.0." + k] = stored.contiguous()
        mtp[k] = stored.float()
    save_file(dict(sorted(out.items())), os.path.join(fdir, "model.safetensors"), metadata={"format": "pt"})
    cfg_d = g.config_json(cfg, FX)
    cfg_d.update(num_hidden_layers=3, num_nextn_predict_layers=1, layer_types=FX["layer_types"][:3],
                 mlp_layer_types=FX["mlp_layer_types"][:3])
    with open(os.path.join(fdir, "config.json"), "w") as f:
        json.dump(cfg_d, f, indent=2)
    # v4_mtp_hf: the same values with the MTP block in transformers' spelling (model.mtp.0.self_attn.q_a_proj,
    # fused mlp.experts.gate_up_proj, ...; transformers itself drops mtp.*), no reference of its own.
    hdir = os.path.join(out_root, "v4_mtp_hf")
    os.makedirs(hdir, exist_ok=True)
    hf = {k: v for k, v in disk.items() if not k.startswith("model.layers.3.")}
    hf.update({"model.mtp.0." + k[len("model.layers.3."):]: v for k, v in disk.items() if k.startswith("model.layers.3.")})
    hf.update({"model.mtp.0." + k: out["mtp.0." + k] for k in extra})
    save_file(dict(sorted(hf.items())), os.path.join(hdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hdir, "config.json"), "w") as f:
        json.dump(cfg_d, f, indent=2)

    ref = DeepseekV4ForCausalLM(copy.deepcopy(cfg)).float().eval()
    missing, unexpected = ref.load_state_dict(back, strict=False)
    assert not [m for m in missing if "rotary" not in m and "inv_freq" not in m] and not unexpected
    pgen = torch.Generator().manual_seed(FX["seed"] + 7)
    prompt = torch.randint(3, cfg.vocab_size, (FX["prompt_len"],), generator=pgen).tolist()
    ids = torch.tensor([prompt])
    m = ref.model
    captured = {}
    m.layers[2].register_forward_hook(lambda mod, a, o: captured.__setitem__("h", o))

    def head(x, fn, base, scale, norm_w):  # hc_head then norm then the shared head
        flat = x.flatten(2)
        mixes = torch.nn.functional.linear(flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps), fn)
        pre = torch.sigmoid(mixes * scale + base) + cfg.hc_eps
        y = (pre.unsqueeze(-1) * x).sum(2)
        return torch.nn.functional.linear(rms(y, norm_w, cfg.rms_norm_eps), ref.lm_head.weight)

    # Pass 1: the main model's streams after layer 2 and its next token after the prompt.
    ref(ids, use_cache=False)
    h = captured["h"]  # [1, S, hc, H]
    main_logits = head(h, m.hc_head.hc_fn, m.hc_head.hc_base, m.hc_head.hc_scale, m.norm.weight)[0]
    nxt = prompt[1:] + [int(main_logits[-1].argmax())]

    def pre_hook(mod, args, kwargs):
        e = rms(m.embed_tokens(torch.tensor([nxt])), mtp["enorm.weight"], cfg.rms_norm_eps)
        x = torch.nn.functional.linear(rms(h, mtp["hnorm.weight"], cfg.rms_norm_eps), mtp["h_proj.weight"])
        x = torch.nn.functional.linear(e, mtp["e_proj.weight"]).unsqueeze(2) + x
        return (x,) + tuple(args[1:]), kwargs

    m.layers[3].register_forward_pre_hook(pre_hook, with_kwargs=True)
    m.layers[3].register_forward_hook(lambda mod, a, o: captured.__setitem__("mtp", o))
    ref(ids, use_cache=False)
    mtp_logits = head(captured["mtp"], mtp["hc_head_fn"], mtp["hc_head_base"], mtp["hc_head_scale"],
                      mtp["norm.weight"])[0]
    refj = {"prompt_ids": prompt, "next_ids": nxt, "main_logits": g.r8(main_logits.tolist()),
            "mtp_logits": g.r8(mtp_logits.tolist()),
            "transformers_version": __import__("transformers").__version__, "torch_version": torch.__version__,
            "note": ("transformers has no V4 MTP: mtp_logits[i] = MTP block on (main streams at i, next_ids[i]) at "
                     "position i, the block = transformers' DeepseekV4DecoderLayer (sliding, moe) with DeepSeek's "
                     "MTPBlock input/output (see the script's docstring); fp32 eager CPU on the stored values")}
    with open(os.path.join(fdir, "reference.json"), "w") as f:
        json.dump(refj, f)
    size = sum(os.path.getsize(os.path.join(fdir, x)) for x in os.listdir(fdir))
    print(f"[golden] v4_mtp: {size / 1024:.0f} KiB, mtp logit std {float(mtp_logits.std()):.3f}, "
          f"main logit std {float(main_logits.std()):.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/fixtures")
