#!/usr/bin/env python3
"""Writes the tokenizer agreement fixture: gzip JSONL, one object per corpus string.

Expected ids come from HF `tokenizers` (the oracle), never from our code:
  {"text": s, "ids": encode(s, add_special_tokens=False)}
and for every 10th string also
  "ids_special": encode(s, add_special_tokens=True) with the BOS/EOS template that
      transformers' LlamaTokenizerFast builds from tokenizer_config (add_bos_token/add_eos_token),
  "decoded_skip": decode(ids_special, skip_special_tokens=True).
The script checks HF's own decode(encode(s)) == s so the C++ test may assert it too.

Usage: make_fixture.py TOKENIZER_DIR OUT.jsonl.gz [--num-strings N] [--seed S]
"""
import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers.processors import TemplateProcessing  # noqa: E402


def token_text(value):
    if value is None:
        return None
    return value["content"] if isinstance(value, dict) else value


def with_special_template(tok, config):
    """The post-processor transformers (4.x LlamaTokenizerFast.update_post_processor) installs."""
    bos, eos = token_text(config.get("bos_token")), token_text(config.get("eos_token"))
    add_bos, add_eos = config.get("add_bos_token", False), config.get("add_eos_token", False)
    single, specials = "$A:0", []
    if add_bos and bos is not None:
        single = f"{bos}:0 " + single
        specials.append((bos, tok.token_to_id(bos)))
    if add_eos and eos is not None:
        single = single + f" {eos}:0"
        specials.append((eos, tok.token_to_id(eos)))
    out = tokenizers.Tokenizer.from_str(tok.to_str())
    out.post_processor = TemplateProcessing(single=single, special_tokens=specials)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir")
    ap.add_argument("out")
    ap.add_argument("--num-strings", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=20240501)
    args = ap.parse_args()

    tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    config_path = os.path.join(args.tokenizer_dir, "tokenizer_config.json")
    config = json.load(open(config_path, encoding="utf-8")) if os.path.exists(config_path) else {}
    tok_special = with_special_template(tok, config)

    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    # Weight the named tokens (not the hundreds of placeholders) so they appear often.
    named = [t for t in added if "place" not in t]
    corpus = make_corpus(args.seed, args.num_strings, named * 4 + added[:50])

    num_bytes = 0
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as f:
        for i, text in enumerate(corpus):
            ids = tok.encode(text, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == text, f"HF decode(encode(s)) != s for string {i}: {text!r}"
            row = {"text": text, "ids": ids}
            if i % 10 == 0:
                ids_special = tok_special.encode(text, add_special_tokens=True).ids
                row["ids_special"] = ids_special
                row["decoded_skip"] = tok.decode(ids_special, skip_special_tokens=True)
            num_bytes += len(text.encode("utf-8"))
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(corpus)} strings, {num_bytes} bytes of text, "
          f"{os.path.getsize(args.out)} bytes on disk")


if __name__ == "__main__":
    main()
