#!/usr/bin/env python3
"""Trains a small byte-level BPE tokenizer (vocab ~8k) with HF `tokenizers`, in DeepSeek-V3's
format (same Split pre-tokenizers, ByteLevel, special tokens, decoder), so tests cover a
tokenizer.json written by the `tokenizers` trainer and not only DeepSeek's file.

Usage: train_tiny_tokenizer.py DEEPSEEK_V3_DIR OUT_DIR [--vocab-size 8000]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import pre_tokenizers, trainers  # noqa: E402

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
NON_SPECIAL_ADDED = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("deepseek_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=8000)
    args = ap.parse_args()

    ds = json.load(open(os.path.join(args.deepseek_dir, "tokenizer.json"), encoding="utf-8"))
    # Reuse DeepSeek-V3's pre-tokenizer definition verbatim.
    tok = tokenizers.Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": ds["pre_tokenizer"],
        "post_processor": ds["post_processor"], "decoder": ds["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": {}, "merges": []}}))
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(make_corpus(seed=7, num_strings=30000), trainer=trainer)
    tok.add_tokens([tokenizers.AddedToken(t, normalized=True, special=False)
                    for t in NON_SPECIAL_ADDED])
    os.makedirs(args.out_dir, exist_ok=True)
    tok.save(os.path.join(args.out_dir, "tokenizer.json"))
    config = {"add_bos_token": True, "add_eos_token": False,
              "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
              "tokenizer_class": "LlamaTokenizerFast"}
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    print(f"vocab size {tok.get_vocab_size()} -> {args.out_dir}")


if __name__ == "__main__":
    main()
