"""Converts a deepinfer checkpoint to GGUF with llama.cpp's own converter (bench/cpu/vs_llamacpp.sh).

The converter recognises a BPE pre-tokenizer by hashing a test string's token ids, so a model
trained with its own (smaller) vocabulary but DeepSeek-V3's pre-tokenizer regex is refused.
When the checkpoint's `pre_tokenizer` JSON equals DeepSeek-V3's (../shared tokenizer), this
answers "deepseek-v3" for it; anything else keeps the converter's own check.

usage: convert_for_llamacpp.py LLAMA_CPP_DIR MODEL_DIR REFERENCE_TOKENIZER_JSON OUT.gguf OUTTYPE
"""
import json
import os
import sys

llama_dir, model_dir, reference, out, outtype = sys.argv[1:6]
sys.path.insert(0, llama_dir)
sys.path.insert(0, os.path.join(llama_dir, "gguf-py"))
with open(os.path.join(model_dir, "tokenizer.json")) as f:
    ours = json.load(f)["pre_tokenizer"]
with open(reference) as f:
    same_pre = ours == json.load(f)["pre_tokenizer"]

import conversion.base as base  # noqa: E402  (llama.cpp's converter package)

original = base.TextModel.get_vocab_base_pre


def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        if same_pre:
            return "deepseek-v3"
        raise


base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", out]
import runpy  # noqa: E402
runpy.run_path(os.path.join(llama_dir, "convert_hf_to_gguf.py"), run_name="__main__")
