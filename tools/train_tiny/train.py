#!/usr/bin/env python3
"""Train deepinfer's embedded default model: a tiny DeepSeek-V3-architecture Python-code model.

Usage:
  python tools/train_tiny/train.py --out-model models/deepseek-v3-tiny-code --out-fixture FILE [--quick]
         [--device cuda|cpu] [--train-seconds 330]

Everything is seeded.  Steps:
  1. corpus  - *.py files of this interpreter's stdlib + site-packages (rules in select_files()).
  2. tokenizer - byte-level BPE (HF `tokenizers`), DeepSeek-V3 pipeline (deepseek_v3_tokenizer_spec.json).
  3. model   - transformers DeepseekV3ForCausalLM (MLA + q_lora, sigmoid/noaux_tc MoE, groups, shared experts,
               1 dense layer) + one DeepSeek-V3 MTP layer trained jointly (weight MTP_WEIGHT) to predict t+2.
               Routed-expert bias e_score_correction_bias is updated aux-loss-free (DeepSeek-V3 rule).
  4. export  - official DeepSeek layout: FP8 e4m3 linear weights + 128x128 F32 *_scale_inv, bf16 norms/
               embedding/lm_head/router, F32 bias, MTP at layer num_hidden_layers; config.json in official spelling.
  5. verify  - stock transformers DeepseekV3ForCausalLM (+ transformers' own MtpModel) on the DEQUANTIZED weights
               must reproduce our logits; report losses, perplexity, MTP acceptance, samples; write the fixture.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import re
import sys
import sysconfig
import tempfile
import time

T_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "golden"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dsutil  # noqa: E402
import transformers  # noqa: E402
transformers.logging.set_verbosity_error()  # the MTP-weights "UNEXPECTED" load reports are expected
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdv3  # noqa: E402

MTP_WEIGHT = 0.3
BIAS_UPDATE_SPEED = 1e-3  # DeepSeek-V3 aux-loss-free balancing gamma
SEED = 1234

FULL = dict(
    corpus_cap=128 * 2**20, bpe_cap=32 * 2**20, heldout_cap=3 * 2**20, vocab=8192,
    seq=512, batch=96, steps=2400, warmup=100, lr=2e-3, min_lr_frac=0.1, eval_windows=96,
    model=dict(hidden_size=384, intermediate_size=1024, moe_intermediate_size=128, num_hidden_layers=5,
               num_attention_heads=6, num_key_value_heads=6, n_shared_experts=2, n_routed_experts=16,
               num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
               q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
               first_k_dense_replace=1, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_interleave=True),
    accept_prompts=10, gen_len=64, sample_len=96,
)
QUICK = dict(
    corpus_cap=2 * 2**20, bpe_cap=1 * 2**20, heldout_cap=256 * 1024, vocab=1024,
    seq=128, batch=8, steps=24, warmup=5, lr=3e-3, min_lr_frac=0.1, eval_windows=4,
    model=dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=8,
               num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
               q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
               first_k_dense_replace=1, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_interleave=True),
    accept_prompts=5, gen_len=16, sample_len=16,  # quick: smoke test only (the real fixture uses 64)
)
DISK_BUDGET = 32 * 2**20

SAMPLE_PROMPTS = [
    "def fibonacci(n):\n",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "def fibonacci(n: int) -> int:\n    if n < 2:\n",
]


def log(*a):
    print(f"[train {time.time() - T_START:6.1f}s]", *a, flush=True)


def banner(msg):
    line = "!" * 100
    print(f"{line}\n!!! {msg}\n{line}", flush=True)


# ----------------------------------------------------------------------------------------------- corpus
SKIP_DIRS = {"__pycache__", "test", "tests", "testing", "idle_test", "site-packages", "dist-packages",
             "node_modules", ".git"}


def h64(s: str) -> int:
    return int(hashlib.sha1(s.encode()).hexdigest()[:16], 16)


def select_files():
    """Corpus rule (deterministic given the installed files):
    roots = sysconfig stdlib ('stdlib/...'), purelib and platlib ('site/...'), de-duplicated;
    walk each root (sorted), skipping directories named test/tests/testing/idle_test/__pycache__ and nested
    site-packages; keep *.py files of 256 B .. 256 KiB whose name does not start with 'test_' or end with '_test.py'.
    key = '<root tag>/<path relative to root>'.  held-out iff sha1(key) % 100 < 3.
    Files are visited in sha1(key) order (a fixed pseudo-random shuffle), read as strict UTF-8 (others skipped),
    exact-duplicate contents dropped (sha1 of content), until the train / held-out byte caps are reached."""
    paths = sysconfig.get_paths()
    roots, seen = [], set()
    for tag, key in (("stdlib", "stdlib"), ("site", "purelib"), ("site", "platlib")):
        p = paths.get(key)
        if p and os.path.isdir(p):
            rp = os.path.realpath(p)
            if rp not in seen:
                seen.add(rp)
                roots.append((tag, p))
    files = []
    for tag, root in roots:
        for dp, dns, fns in os.walk(root):
            dns[:] = sorted(d for d in dns if d not in SKIP_DIRS and not d.endswith((".dist-info", ".egg-info")))
            for fn in sorted(fns):
                if not fn.endswith(".py") or fn.startswith("test_") or fn.endswith("_test.py"):
                    continue
                full = os.path.join(dp, fn)
                try:
                    sz = os.path.getsize(full)
                except OSError:
                    continue
                if 256 <= sz <= 256 * 1024:
                    files.append((f"{tag}/{os.path.relpath(full, root)}", full, sz))
    files.sort(key=lambda x: (h64(x[0]), x[0]))
    return roots, files


def read_corpus(cfg):
    roots, files = select_files()
    train, held, seen = [], [], set()
    tb = hb = 0
    for key, full, _ in files:
        is_held = h64(key) % 100 < 3
        if is_held and hb >= cfg["heldout_cap"]:
            continue
        if not is_held and tb >= cfg["corpus_cap"]:
            continue
        if tb >= cfg["corpus_cap"] and hb >= cfg["heldout_cap"]:
            break
        try:
            with open(full, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ch = hashlib.sha1(raw).digest()
        if ch in seen:
            continue
        seen.add(ch)
        if is_held:
            held.append((key, text))
            hb += len(raw)
        else:
            train.append((key, text))
            tb += len(raw)
    stats = dict(roots=[r for _, r in roots], candidate_files=len(files), train_files=len(train),
                 train_bytes=tb, heldout_files=len(held), heldout_bytes=hb)
    return train, held, stats


# -------------------------------------------------------------------------------------------- tokenizer
def build_tokenizer(train_docs, cfg):
    from tokenizers import Tokenizer, trainers, models, pre_tokenizers
    spec = json.load(open(os.path.join(HERE, "deepseek_v3_tokenizer_spec.json"), encoding="utf-8"))
    names = list(spec["special_tokens"])
    head, tail = names[:3], names[3:]  # bos, eos, pad at ids 0,1,2 (as in V3); others at the top of the vocab
    tok = Tokenizer(models.BPE())
    # Build the V3 pipeline from its JSON definition (exactly the same regexes / flags)
    base = json.loads(tok.to_str())
    base["normalizer"] = spec["normalizer"]
    base["pre_tokenizer"] = spec["pre_tokenizer"]
    base["post_processor"] = spec["post_processor"]
    base["decoder"] = spec["decoder"]
    tok = Tokenizer.from_str(json.dumps(base))
    trainer = trainers.BpeTrainer(vocab_size=cfg["vocab"] - len(tail), min_frequency=2, show_progress=False,
                                  special_tokens=head, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    budget, chunk = cfg["bpe_cap"], []
    for _, t in train_docs:
        if budget <= 0:
            break
        chunk.append(t)
        budget -= len(t)
    tok.train_from_iterator(chunk, trainer=trainer, length=len(chunk))
    d = json.loads(tok.to_str())
    n = len(d["model"]["vocab"])
    assert n == cfg["vocab"] - len(tail), (n, cfg["vocab"], len(tail))
    added = []
    for i, name in enumerate(names):
        fl = spec["special_tokens"][name]
        idx = i if i < 3 else n + (i - 3)
        added.append(dict(id=idx, content=name, **{k: fl[k] for k in ("single_word", "lstrip", "rstrip",
                                                                      "normalized", "special")}))
    d["added_tokens"] = added
    # DeepSeek-V3's tokenizer.json writes merges as "left right" strings (byte-level tokens never contain a space)
    d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    d["model"].pop("ignore_merges", None)
    d["truncation"] = None
    d["padding"] = None
    tok = Tokenizer.from_str(json.dumps(d, ensure_ascii=False))
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["vocab"]
    assert tok.token_to_id(names[0]) == 0 and tok.token_to_id(names[1]) == 1
    return tok, d, spec


def tokenizer_config(spec, max_len):
    def at(name):
        fl = spec["special_tokens"][name]
        return {"__type": "AddedToken", "content": name, "lstrip": fl["lstrip"], "normalized": True,
                "rstrip": fl["rstrip"], "single_word": fl["single_word"]}
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": at(bos), "eos_token": at(eos),
            "pad_token": at(eos), "clean_up_tokenization_spaces": False, "legacy": True,
            "model_max_length": max_len, "sp_model_kwargs": {}, "unk_token": None,
            "tokenizer_class": spec["tokenizer_class"], "chat_template": spec["chat_template"]}


def encode_docs(tok, docs, time_cap=None):
    """Each document -> [BOS] + ids + [EOS], concatenated (documents in corpus order).
    time_cap: stop (loudly) after that many seconds - a safety net that normally does not fire."""
    out = []
    B = 1024
    t0 = time.time()
    for i in range(0, len(docs), B):
        encs = tok.encode_batch([t for _, t in docs[i:i + B]], add_special_tokens=False)
        for e in encs:
            out.append(0)
            out.extend(e.ids)
            out.append(1)
        if time_cap and time.time() - t0 > time_cap and i + B < len(docs):
            banner(f"TOKENIZATION TIME CAP: encoded only {i + B}/{len(docs)} training documents in "
                   f"{time.time() - t0:.0f}s; the rest of the corpus is not used")
            break
    return torch.tensor(out, dtype=torch.int32)


# ------------------------------------------------------------------------------------------------ model
def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Training-only experts forward: all experts computed densely, unselected ones weighted 0.
    Mathematically identical to transformers' loop (sum over chosen experts of w * expert(x)), but with
    static shapes and no host syncs.  Restored to the stock forward before any verification."""
    T = hidden_states.shape[0]
    E, I2, H = self.gate_up_proj.shape
    w = torch.zeros(T, E, dtype=top_k_weights.dtype, device=hidden_states.device)
    w = w.scatter(1, top_k_index, top_k_weights)
    gu = hidden_states @ self.gate_up_proj.reshape(E * I2, H).t()  # [T, E*2I]
    gu = gu.view(T, E, I2)
    g, u = gu.chunk(2, dim=-1)
    a = self.act_fn(g) * u * w.unsqueeze(-1).to(gu.dtype)  # [T, E, I]
    down = self.down_proj.permute(0, 2, 1).reshape(E * (I2 // 2), H)  # [E*I, H]
    return (a.reshape(T, -1) @ down).to(hidden_states.dtype)


STOCK_EXPERTS_FORWARD = mdv3.DeepseekV3Experts.forward


class MTPLayer(nn.Module):
    """DeepSeek-V3 multi-token-prediction module (depth 1), same math as transformers' MtpLayer:
    x_i = eh_proj(cat[enorm(embed(t_{i+1})), hnorm(h_i)]); x = block(x) (causal); logits = lm_head(norm(x))
    where h_i is the main model's last hidden state AFTER model.norm; embed and lm_head are shared."""

    def __init__(self, config, layer_idx):
        super().__init__()
        c = copy.deepcopy(config)
        c.first_k_dense_replace = 0  # the MTP block is always MoE
        H = config.hidden_size
        self.enorm = mdv3.DeepseekV3RMSNorm(H, eps=config.rms_norm_eps)
        self.hnorm = mdv3.DeepseekV3RMSNorm(H, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.block = mdv3.DeepseekV3DecoderLayer(c, layer_idx)
        self.norm = mdv3.DeepseekV3RMSNorm(H, eps=config.rms_norm_eps)  # shared_head.norm

    def forward(self, h, next_emb, position_embeddings, position_ids):
        x = self.eh_proj(torch.cat([self.enorm(next_emb), self.hnorm(h)], dim=-1))
        x = self.block(x, attention_mask=None, position_embeddings=position_embeddings, position_ids=position_ids,
                       use_cache=False)
        return self.norm(x)


class TinyDeepSeek(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.lm = DeepseekV3ForCausalLM(config)
        self.mtp = MTPLayer(config, config.num_hidden_layers)

    def forward(self, ids, want_mtp=True):
        """ids [B, L] -> (main logits [B, L, V], mtp logits [B, L-1, V] (row i drafts token i+2), hidden)."""
        out = self.lm.model(input_ids=ids, use_cache=False)
        h = out.last_hidden_state
        logits = self.lm.lm_head(h)
        if not want_mtp:
            return logits, None, h
        L = ids.shape[1]
        pos = torch.arange(1, L, device=ids.device)[None]
        emb = self.lm.model.embed_tokens(ids[:, 1:])
        pe = self.lm.model.rotary_emb(emb, position_ids=pos)
        x = self.mtp(h[:, :-1], emb, pe, pos)
        return logits, self.lm.lm_head(x), h


def init_weights(model, n_layers, gen):
    std = 0.02
    for name, p in sorted(model.named_parameters()):
        if "norm" in name:
            v = torch.ones(p.shape)
        else:
            s = std
            if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                s = std / math.sqrt(2 * (n_layers + 1))
            v = torch.randn(p.shape, generator=gen) * s
        with torch.no_grad():
            p.copy_(v)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()


def make_config(cfg, vocab):
    m = dict(cfg["model"])
    c = DeepseekV3Config(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                         tie_word_embeddings=False, num_nextn_predict_layers=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **m)
    c._attn_implementation = "sdpa"
    return c


def export_state_dict(model: TinyDeepSeek, n_layers: int) -> dict:
    """HF fused names -> official DeepSeek names (per-expert), MTP at layer n_layers."""
    sd = {}
    for k, v in model.lm.state_dict().items():
        if "rotary_emb" in k:
            continue
        sd[k] = v.detach().float().cpu()
    pre = f"model.layers.{n_layers}."
    m = model.mtp
    sd[pre + "enorm.weight"] = m.enorm.weight.detach().float().cpu()
    sd[pre + "hnorm.weight"] = m.hnorm.weight.detach().float().cpu()
    sd[pre + "eh_proj.weight"] = m.eh_proj.weight.detach().float().cpu()
    sd[pre + "shared_head.norm.weight"] = m.norm.weight.detach().float().cpu()
    for k, v in m.block.state_dict().items():
        sd[pre + k] = v.detach().float().cpu()
    return dsutil.unfuse_experts(sd)


def import_state_dict(model: TinyDeepSeek, sd32: dict, n_layers: int, n_experts: int):
    """Inverse of export_state_dict (takes dequantized fp32 official-name tensors)."""
    fused = dsutil.fuse_experts(sd32, n_experts)
    pre = f"model.layers.{n_layers}."
    main = {k: v for k, v in fused.items() if not k.startswith(pre)}
    mk = {k[len(pre):]: v for k, v in fused.items() if k.startswith(pre)}
    miss, unexp = model.lm.load_state_dict(main, strict=False)
    assert not [x for x in miss if "rotary" not in x] and not unexp, (miss, unexp)
    mtp = {"enorm.weight": mk.pop("enorm.weight"), "hnorm.weight": mk.pop("hnorm.weight"),
           "eh_proj.weight": mk.pop("eh_proj.weight"), "norm.weight": mk.pop("shared_head.norm.weight")}
    mtp.update({"block." + k: v for k, v in mk.items()})
    miss, unexp = model.mtp.load_state_dict(mtp, strict=False)
    assert not miss and not unexp, (miss, unexp)


# ---------------------------------------------------------------------------------------------- helpers
def lr_at(step, total, cfg):
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    p = min(1.0, (step - cfg["warmup"]) / max(1, total - cfg["warmup"]))
    return cfg["lr"] * (cfg["min_lr_frac"] + (1 - cfg["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(model, windows, device, autocast, bs=16):
    """Held-out metrics on fixed windows: main CE, MTP CE, teacher-forced MTP acceptance."""
    model.eval()
    tot = n = mtot = mn = acc = accn = top1 = 0.0
    for i in range(0, len(windows), bs):
        w = windows[i:i + bs].to(device).long()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            logits, mlog, _ = model(w)
        logits, mlog = logits.float(), mlog.float()
        tot += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                               reduction="sum").item()
        n += w[:, 1:].numel()
        mtot += F.cross_entropy(mlog[:, :-1].reshape(-1, mlog.shape[-1]), w[:, 2:].reshape(-1),
                                reduction="sum").item()
        mn += w[:, 2:].numel()
        main_pred = logits.argmax(-1)  # [B, L]: prediction of token i+1
        draft = mlog.argmax(-1)  # [B, L-1]: draft of token i+2
        acc += (draft[:, :-1] == main_pred[:, 1:-1]).sum().item()
        accn += draft[:, :-1].numel()
        top1 += (main_pred[:, :-1] == w[:, 1:]).sum().item()
    model.train()
    return dict(loss=tot / n, ppl=math.exp(tot / n), mtp_loss=mtot / mn, mtp_accept_teacher_forced=acc / accn,
                top1_acc=top1 / n, tokens=int(n))


@torch.no_grad()
def greedy_hf(hf, ids, n, device):
    """Greedy decode with stock transformers, full recompute each step (no cache), fp32, no EOS stop."""
    seq = list(ids)
    gaps, top5 = [], None
    for s in range(n):
        lg = hf(torch.tensor([seq], device=device), use_cache=False).logits[0, -1].float().cpu()
        tv, ti = torch.topk(lg, 5)
        if s == 0:
            top5 = [[int(a), float(b)] for a, b in zip(ti, tv)]
        gaps.append(float(tv[0] - tv[1]))
        seq.append(int(ti[0]))
    return seq[len(ids):], min(gaps), top5


def function_prompts(held, k, skip=0):
    """Beginnings of held-out functions: the `def` line plus its next non-empty line, from held-out files
    in key order (one per file)."""
    out = []
    pat = re.compile(r"^[ \t]*def [A-Za-z_]\w*\(.*\)(\s*->\s*[^:]+)?:[ \t]*$")
    for key, text in sorted(held):
        lines = text.split("\n")
        for j, ln in enumerate(lines[:-1]):
            if pat.match(ln) and lines[j + 1].strip() and len(ln) < 120 and len(lines[j + 1]) < 120:
                ind = len(ln) - len(ln.lstrip())
                prompt = "\n".join(x[ind:] for x in lines[j:j + 2]) + "\n"
                out.append((key, prompt))
                break
    return out[skip:skip + k]


# ------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-model", required=True)
    ap.add_argument("--out-fixture", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--train-seconds", type=float, default=None,
                    help="wall-clock guard for the training loop (default 300 full / 30 quick)")
    ap.add_argument("--total-seconds", type=float, default=None,
                    help="whole-script deadline: the training budget shrinks so that the run (with ~110 s reserved "
                         "for evaluation/export/verification after training) ends before it")
    a = ap.parse_args()
    cfg = QUICK if a.quick else FULL
    budget = a.train_seconds or (30.0 if a.quick else 300.0)
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        banner("cuda requested but not available: running on CPU")
        dev = "cpu"
    use_amp = dev == "cuda"
    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if dev == "cuda":
        log("device:", torch.cuda.get_device_name(0))
    report = {"mode": "quick" if a.quick else "full", "seed": SEED, "device": dev,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__}

    # ---- corpus
    train_docs, held_docs, cstats = read_corpus(cfg)
    log(f"corpus: {cstats['train_files']} train files ({cstats['train_bytes'] / 2**20:.1f} MiB), "
        f"{cstats['heldout_files']} held-out ({cstats['heldout_bytes'] / 2**20:.2f} MiB) "
        f"of {cstats['candidate_files']} candidates; roots {cstats['roots']}")
    cstats["rule"] = select_files.__doc__.strip()
    report["corpus"] = cstats
    phases = {"corpus": round(time.time() - T_START, 1)}
    report["phase_end_seconds"] = phases

    # ---- tokenizer
    tok, tok_json, spec = build_tokenizer(train_docs, cfg)
    log(f"tokenizer: vocab {tok.get_vocab_size()} trained on <= {cfg['bpe_cap'] / 2**20:.0f} MiB")
    train_ids = encode_docs(tok, train_docs, time_cap=75)
    held_ids = encode_docs(tok, held_docs)
    report["tokenizer"] = dict(vocab=tok.get_vocab_size(), train_tokens=int(train_ids.numel()),
                               heldout_tokens=int(held_ids.numel()),
                               bytes_per_token=round(cstats["train_bytes"] / max(1, train_ids.numel()), 3))
    phases["tokenizer+encode"] = round(time.time() - T_START, 1)
    log(f"tokens: train {train_ids.numel():,}  held-out {held_ids.numel():,}  "
        f"({report['tokenizer']['bytes_per_token']} bytes/token)")

    # ---- model
    config = make_config(cfg, cfg["vocab"])
    gen = torch.Generator().manual_seed(SEED)
    model = TinyDeepSeek(config)
    init_weights(model, config.num_hidden_layers, gen)
    model.to(dev)
    mdv3.DeepseekV3Experts.forward = dense_experts_forward
    n_total = sum(p.numel() for p in model.lm.parameters())
    n_mtp_unique = sum(p.numel() for p in model.mtp.parameters())
    E, K, I, H = config.n_routed_experts, config.num_experts_per_tok, config.moe_intermediate_size, config.hidden_size
    n_moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    n_active = n_total - n_moe_layers * (E - K) * 3 * I * H
    log(f"params: main {n_total / 1e6:.2f}M total, {n_active / 1e6:.2f}M active/token; "
        f"MTP layer +{n_mtp_unique / 1e6:.2f}M (embedding/head shared)")
    report["params"] = dict(total_main=n_total, active_main=n_active, mtp_extra=n_mtp_unique,
                            note="active = all main-model params (incl. embedding + lm_head) minus the unchosen "
                                 f"{E - K} of {E} routed experts in each of {n_moe_layers} MoE layers")

    decay, no_decay = [], []
    for n_, p in model.named_parameters():
        (no_decay if ("norm" in n_ or "embed_tokens" in n_ or p.dim() < 2) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
    routers = [m for m in model.modules() if isinstance(m, mdv3.DeepseekV3TopkRouter)]
    counts = {id(r): torch.zeros(E, device=dev) for r in routers}

    def hook(mod, inp, out):
        counts[id(mod)] += torch.bincount(out[2].reshape(-1), minlength=E).float()
    handles = [r.register_forward_hook(hook) for r in routers]

    # fixed evaluation windows from held-out text
    L = cfg["seq"]
    nw = min(cfg["eval_windows"], (held_ids.numel() - 1) // (L + 1))
    eval_windows = held_ids[: nw * (L + 1)].view(nw, L + 1)[:, :L].contiguous()

    # ---- train
    if a.total_seconds:
        left = a.total_seconds - (time.time() - T_START) - (110.0 if not a.quick else 60.0)
        if left < budget:
            banner(f"training budget cut from {budget:.0f}s to {max(left, 20):.0f}s to meet the --total-seconds deadline")
            budget = max(left, 20.0)
    report["training_budget_seconds"] = round(budget, 1)
    total_steps = cfg["steps"]
    g = torch.Generator().manual_seed(SEED + 1)
    B = cfg["batch"]
    max_start = train_ids.numel() - L - 1
    losses, guard_fired, resized = [], False, None
    model.train()
    t_train = time.time()
    step = 0
    tokens_trained = 0
    t_step10 = None
    while step < total_steps:
        if step == 10:
            if dev == "cuda":
                torch.cuda.synchronize()
            t_step10 = time.time()
        starts = torch.randint(0, max_start, (B,), generator=g)
        batch = torch.stack([train_ids[s:s + L] for s in starts.tolist()]).to(dev, non_blocking=True).long()
        lr = lr_at(step, total_steps, cfg)
        for gr in opt.param_groups:
            gr["lr"] = lr
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits, mlog, _ = model(batch)
        loss_main = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss_mtp = F.cross_entropy(mlog[:, :-1].float().reshape(-1, mlog.shape[-1]), batch[:, 2:].reshape(-1))
        loss = loss_main + MTP_WEIGHT * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free load balancing (DeepSeek-V3): push bias toward under-used experts
            for r in routers:
                c = counts[id(r)]
                r.e_score_correction_bias.add_(BIAS_UPDATE_SPEED * torch.sign(c.mean() - c))
                c.zero_()
        step += 1
        tokens_trained += B * L
        if step % 25 == 0 or step == total_steps or step <= 2:
            lm_, lt_ = loss_main.item(), loss_mtp.item()
            losses.append((step, lm_, lt_))
            el = time.time() - t_train
            log(f"step {step}/{total_steps} loss {lm_:.4f} mtp {lt_:.4f} lr {lr:.2e} "
                f"{tokens_trained / max(el, 1e-9) / 1e3:.0f}k tok/s")
        el = time.time() - t_train
        if step == 30 and resized is None:
            if dev == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t_step10) / 20  # steady-state ms/step (steps 10..30)
            el = time.time() - t_train
            proj = el + per * (total_steps - 30)
            if proj > budget * 0.97:
                new_total = max(31, 30 + int((budget * 0.95 - el) / per))
                banner(f"STEP COUNT REDUCED: {total_steps} steps would take ~{proj:.0f}s at {per * 1e3:.0f} ms/step "
                       f"> training budget {budget:.0f}s; training {new_total} steps instead (LR schedule rescaled)")
                resized = dict(planned=total_steps, actual=new_total, ms_per_step=per * 1e3)
                total_steps = new_total
            else:
                resized = False
                log(f"speed check: {per * 1e3:.0f} ms/step, projected {proj:.0f}s for {total_steps} steps (budget "
                    f"{budget:.0f}s) - OK")
        if el > budget and step < total_steps:
            guard_fired = True
            banner(f"WALL-CLOCK GUARD FIRED: stopped training at step {step}/{total_steps} after {el:.0f}s "
                   f"(budget {budget:.0f}s). Model is UNDER-TRAINED relative to plan.")
            break
    for hd in handles:
        hd.remove()
    train_time = time.time() - t_train
    phases["train"] = round(time.time() - T_START, 1)
    final_train = sum(x[1] for x in losses[-4:]) / len(losses[-4:])
    log(f"training done: {step} steps, {tokens_trained:,} tokens, {train_time:.0f}s, final train loss "
        f"{final_train:.4f}")
    report["training"] = dict(steps=step, planned_steps=cfg["steps"], step_count_reduced=resized or False,
                              wall_clock_guard_fired=guard_fired, tokens_trained=tokens_trained, seq_len=L, batch=B,
                              seconds=round(train_time, 1), final_train_loss=round(final_train, 4),
                              final_train_loss_note="mean main-model CE over the last 4 logged steps",
                              mtp_loss_weight=MTP_WEIGHT, lr=cfg["lr"], loss_log=losses,
                              bias_update="aux-loss-free: bias += 1e-3 * sign(mean_load - load) per step, per MoE "
                                          "router (incl. MTP block)")
    bias_abs = max(float(r.e_score_correction_bias.abs().max()) for r in routers)
    report["training"]["max_abs_e_score_correction_bias"] = bias_abs

    ev_bf16 = evaluate(model, eval_windows, dev, use_amp)
    log(f"held-out (trained weights{', bf16 autocast' if use_amp else ''}): loss {ev_bf16['loss']:.4f} "
        f"ppl {ev_bf16['ppl']:.2f} mtp-accept {ev_bf16['mtp_accept_teacher_forced']:.3f}")

    # ---- export (official DeepSeek layout, FP8)
    mdv3.DeepseekV3Experts.forward = STOCK_EXPERTS_FORWARD
    out_dir = a.out_model
    os.makedirs(out_dir, exist_ok=True)
    n_layers = config.num_hidden_layers
    sd = export_state_dict(model, n_layers)
    disk = dict(sorted(dsutil.quantize_state_dict(sd).items()))
    save_file(disk, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_d = config.to_dict()
    cfg_d["architectures"] = ["DeepseekV3ForCausalLM"]
    for k in ("_attn_implementation", "attn_implementation", "_experts_implementation"):
        cfg_d.pop(k, None)
    cfg_off = dsutil.official_config(cfg_d, 10000.0, None, {
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "num_nextn_predict_layers": 1,
        "model_type": "deepseek_v3", "ep_size": 1, "moe_layer_freq": 1})
    dsutil.write_json(os.path.join(out_dir, "config.json"), cfg_off, indent=2)
    dsutil.write_json(os.path.join(out_dir, "generation_config.json"),
                      {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False})
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    dsutil.write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(spec, 2048), indent=2)
    assert dsutil.dir_size(out_dir) <= DISK_BUDGET, f"model dir {dsutil.dir_size(out_dir)} B exceeds 32 MiB"
    st_bytes = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log(f"exported {out_dir}: model.safetensors {st_bytes / 2**20:.2f} MiB "
        f"({sum(1 for v in disk.values() if v.dtype == torch.float8_e4m3fn)} fp8 tensors)")
    assert st_bytes <= DISK_BUDGET, f"checkpoint {st_bytes} B exceeds 32 MiB"

    # ---- reload exactly what shipped, dequantize, verify against stock transformers
    disk_back = load_file(os.path.join(out_dir, "model.safetensors"))
    w32 = dsutil.dequantize_state_dict(disk_back)
    shipped = TinyDeepSeek(config)
    import_state_dict(shipped, w32, n_layers, E)
    shipped = shipped.float().to(dev).eval()
    tmp = tempfile.mkdtemp(prefix="tinycode_deq_")
    d2 = dict(cfg_off)
    d2.pop("quantization_config")
    dsutil.write_json(os.path.join(tmp, "config.json"), d2, indent=2)
    save_file({k: v.contiguous() for k, v in w32.items()}, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    hf = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").to(dev).eval()
    vw = eval_windows[:2, :min(L, 256)].long()
    with torch.no_grad():
        ours_logits, ours_mtp, ours_h = [t.float().cpu() for t in shipped(vw.to(dev))]
        # reference check on CPU (robust, independent of the GPU path)
        hf_cpu = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
        hf_out = hf_cpu(vw, use_cache=False, output_hidden_states=True)
        d_main = float((hf_out.logits.float() - ours_logits).abs().max())
        d_mtp = float("nan")
        try:
            from transformers.modeling_layers import MtpModel
            hf_cpu._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n_layers}\..*"]
            mtp_hf = MtpModel.from_pretrained(hf_cpu, device_map={"": "cpu"}).float().eval()
            hh = hf_out.hidden_states[-1]
            d_mtp = 0.0
            for i in (0, vw.shape[1] // 2, vw.shape[1] - 2):  # a few prefix lengths, full causal recompute
                _, cl, _ = mtp_hf(input_ids=vw[:1, 1:i + 2], last_hidden_states=hh[:1, :i + 1],
                                  attention_mask=torch.ones(1, i + 1, dtype=torch.long),
                                  position_ids=torch.arange(1, i + 2)[None], mtp_cache=None)
                d_mtp = max(d_mtp, float((cl[0, -1].float() - ours_mtp[0, i]).abs().max()))
        except Exception as e:  # noqa: BLE001
            banner(f"transformers MtpModel check failed: {type(e).__name__}: {e}")
        model.eval()
        q_err = float((hf_out.logits.float() - model.float().to(dev)(vw.to(dev))[0].float().cpu()).abs().max())
    log(f"verify: stock transformers vs ours on dequantized weights: main max|dlogit| {d_main:.2e}, "
        f"MTP (transformers MtpModel) max|dlogit| {d_mtp:.2e}; fp8 quantization moved logits by up to {q_err:.3f}")
    report["verification"] = dict(
        hf_vs_ours_main_max_abs_logit_diff=d_main, hf_mtpmodel_vs_ours_max_abs_logit_diff=d_mtp,
        fp8_vs_unquantized_max_abs_logit_diff=q_err,
        ok=bool(d_main < 2e-3 and d_mtp < 2e-3),
        note="stock DeepseekV3ForCausalLM.from_pretrained on the dequantized FP8 checkpoint (fp32, eager) vs our "
             "training modules carrying the same dequantized weights (fp32, sdpa); MTP checked against "
             "transformers.modeling_layers.MtpModel loaded from the same files")
    if not report["verification"]["ok"]:
        banner(f"VERIFICATION MISMATCH main {d_main} mtp {d_mtp}")

    phases["export+verify"] = round(time.time() - T_START, 1)
    # ---- metrics on the shipped (dequantized) weights
    ev = evaluate(shipped, eval_windows, dev, False)
    log(f"held-out (shipped FP8 weights, fp32): loss {ev['loss']:.4f} ppl {ev['ppl']:.2f} top1 {ev['top1_acc']:.3f} "
        f"mtp-loss {ev['mtp_loss']:.4f} mtp-accept(teacher-forced) {ev['mtp_accept_teacher_forced']:.3f}")

    # greedy-decode acceptance + fixture
    prompts = function_prompts(held_docs, cfg["accept_prompts"])
    gl = cfg["gen_len"]
    fixture_prompts, acc_hit, acc_n = [], 0, 0
    for pi, (key, text) in enumerate(prompts):
        ids = [0] + tok.encode(text, add_special_tokens=False).ids
        gen_ids, gap, top5 = greedy_hf(hf, ids, gl, dev)
        full = torch.tensor([ids + gen_ids], device=dev)
        with torch.no_grad():
            _, mlog, _ = shipped(full)
        draft = mlog[0].argmax(-1).tolist()  # draft[i] = MTP guess for token i+2
        P = len(ids)
        for i in range(P - 1, P + gl - 2):  # t_{i+1}, t_{i+2} both generated by greedy decode
            acc_hit += int(draft[i] == full[0, i + 2].item())
            acc_n += 1
        if pi < 5:
            fixture_prompts.append(dict(source=key, text=text, prompt_ids=ids, greedy_ids=gen_ids,
                                        completion=tok.decode(gen_ids, skip_special_tokens=False),
                                        eos_in_greedy=1 in gen_ids, min_top1_top2_gap=gap, first_step_top5=top5))
    accept_greedy = acc_hit / max(1, acc_n)
    log(f"MTP acceptance during greedy decode: {accept_greedy:.3f} over {acc_n} drafts ({len(prompts)} prompts)")
    acc_def = ("acceptance_greedy_decode: greedily decode {gl} tokens from held-out function prompts with the main "
               "model; at every decode position i whose next two tokens t_(i+1), t_(i+2) were produced by that "
               "decode, the MTP draft argmax MTP(h_i, embed(t_(i+1))) counts as accepted iff it equals t_(i+2) (the "
               "main model's greedy token at i+1). accept_teacher_forced: same comparison on held-out text windows "
               "(real tokens as inputs): draft at i vs main argmax at i+1.").replace("{gl}", str(gl))
    samples = []
    for text in SAMPLE_PROMPTS:
        ids = [0] + tok.encode(text, add_special_tokens=False).ids
        gen_ids, _, _ = greedy_hf(hf, ids, cfg["sample_len"], dev)
        samples.append(dict(prompt=text, completion=tok.decode(gen_ids, skip_special_tokens=False)))
        print(f"----- sample: {text!r}\n{text}{samples[-1]['completion']}\n-----", flush=True)

    phases["eval+greedy"] = round(time.time() - T_START, 1)
    # does AutoTokenizer add BOS the way our fixture does?
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(out_dir)
        hf_ids = at(fixture_prompts[0]["text"])["input_ids"]
        auto_tok_match = ("same ids incl. BOS" if hf_ids == fixture_prompts[0]["prompt_ids"] else
                          "same ids but WITHOUT BOS (transformers 5.17 does not add BOS here, even for the real "
                          "DeepSeek-V3 tokenizer)" if hf_ids == fixture_prompts[0]["prompt_ids"][1:] else
                          f"DIFFERENT: {hf_ids[:20]}")
    except Exception as e:  # noqa: BLE001
        hf_ids, auto_tok_match = str(e)[:200], False
    report["metrics"] = dict(
        heldout_trained_weights=ev_bf16, heldout_shipped_fp8=ev,
        heldout_loss=round(ev["loss"], 4), heldout_ppl=round(ev["ppl"], 3),
        mtp_accept_greedy_decode=round(accept_greedy, 4), mtp_accept_teacher_forced=round(
            ev["mtp_accept_teacher_forced"], 4), mtp_accept_definition=acc_def, mtp_drafts_counted=acc_n,
        heldout_eval=f"{nw} fixed windows of {L} tokens from the start of the held-out token stream")
    report["samples"] = samples
    report["files"] = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    report["autotokenizer_matches_fixture_ids"] = auto_tok_match

    fixture = dict(
        model=os.path.basename(os.path.normpath(out_dir)), model_dir=out_dir,
        description="Held-out Python function prompts for the shipped tiny DeepSeek-V3 code model. prompt_ids = "
                    "[BOS=0] + tokenizer.json encoding of text (no other specials). greedy_ids = 64 tokens from stock "
                    "transformers DeepseekV3ForCausalLM, fp32, on the DEQUANTIZED FP8 checkpoint (fp8 x "
                    "scale_inv), argmax, recomputed without cache each step, NO EOS stopping "
                    "(eos_in_greedy records whether id 1 appeared).",
        transformers_version=transformers.__version__, torch_version=torch.__version__, device=dev,
        autotokenizer_adds_bos_and_matches=auto_tok_match, prompts=fixture_prompts,
        mtp_accept_greedy_decode=accept_greedy)
    os.makedirs(os.path.dirname(os.path.abspath(a.out_fixture)), exist_ok=True)
    dsutil.write_json(a.out_fixture, fixture, indent=1)
    report["total_seconds"] = round(time.time() - T_START, 1)
    dsutil.write_json(os.path.join(out_dir, "train_report.json"), report, indent=1)

    print("=" * 100)
    print(f"model            : {out_dir}  ({sum(report['files'].values()) / 2**20:.2f} MiB on disk)")
    print(f"params           : {n_total / 1e6:.2f}M total, {n_active / 1e6:.2f}M active (+{n_mtp_unique / 1e6:.2f}M MTP)")
    print(f"tokens trained   : {tokens_trained:,} in {step} steps ({train_time:.0f}s)"
          f"{'  [GUARD FIRED]' if guard_fired else ''}{'  [STEPS REDUCED]' if resized else ''}")
    print(f"final train loss : {final_train:.4f}")
    print(f"held-out         : loss {ev['loss']:.4f}  ppl {ev['ppl']:.2f}  (pre-quantization {ev_bf16['loss']:.4f})")
    print(f"MTP acceptance   : greedy-decode {accept_greedy:.3f}, teacher-forced {ev['mtp_accept_teacher_forced']:.3f}")
    print(f"HF verification  : main {d_main:.1e}, MTP {d_mtp:.1e}  -> {'OK' if report['verification']['ok'] else 'MISMATCH'}")
    print(f"total time       : {report['total_seconds']:.0f}s")
    print("=" * 100, flush=True)


if __name__ == "__main__":
    main()
