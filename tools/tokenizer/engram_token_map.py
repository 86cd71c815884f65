"""Writes DeepSeek-V4.1's Engram token map as the sidecar the engine reads beside a checkpoint.

  python tools/tokenizer/engram_token_map.py CHECKPOINT_DIR   # -> CHECKPOINT_DIR/engram_token_map.safetensors

The map (model/deepseek_v41/weights.h) sends every token id to a compressed id: tokens whose decoded text
normalises alike share one (the definition is the unmerged transformers PR's build_compressed_token_map:
NFKC, NFD, strip accents, lowercase, runs of space/tab/CR/LF -> one space, a text that is exactly one space
kept as it is, then stripped; a token decoding to U+FFFD (a partial UTF-8 byte) is keyed by its raw token
string; an empty normalisation keys by the decoded text; compressed ids in first-seen order). The number of
distinct ids must equal config.json's engram_compressed_vocab_size (99,092 for V4.1-Flash): the engine
refuses a map that does not. Needs the `tokenizers` and `transformers` packages and the checkpoint's
tokenizer files.
"""
from __future__ import annotations

import argparse
import json
import os


def normalizer():
    from tokenizers import Regex, normalizers

    keep = "\ue000"  # a private-use stand-in so a lone space survives Strip()
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), keep),
        normalizers.Strip(), normalizers.Replace(keep, " ")])


def token_map(tokenizer):
    """(map: list of compressed ids per token id, number of distinct ids) for a transformers fast tokenizer."""
    norm, backend = normalizer(), tokenizer.backend_tokenizer
    ids: dict[str, int] = {}
    out = []
    for t in range(len(tokenizer)):
        text = backend.decode([t], skip_special_tokens=False)
        key = backend.id_to_token(t) if "\ufffd" in text else (norm.normalize_str(text) or text)
        out.append(ids.setdefault(key, len(ids)))
    return out, len(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    a = ap.parse_args()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    m, n = token_map(AutoTokenizer.from_pretrained(a.checkpoint))
    with open(os.path.join(a.checkpoint, "config.json")) as f:
        cfg = json.load(f)
    want = cfg.get("text_config", cfg).get("engram_compressed_vocab_size", 99092)
    if n != want:
        raise SystemExit(f"{n} distinct compressed ids, config.json says engram_compressed_vocab_size {want}")
    path = os.path.join(a.checkpoint, "engram_token_map.safetensors")
    save_file({"token_map": torch.tensor(m, dtype=torch.int32)}, path, metadata={"format": "pt"})
    print(f"{path}: {len(m)} tokens -> {n} compressed ids")


if __name__ == "__main__":
    main()
