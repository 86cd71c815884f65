"""deepinfer info end to end: the KV layer groups of a checkpoint (V3: one latent group, V3.2:
latent + indexer keys) with their rows in bytes, in JSON and in the text summary."""
import json
import os
import subprocess
import sys

binary, root = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


fixtures = os.path.join(root, "tests", "golden", "fixtures")
r = subprocess.run([binary, "info", "--model", os.path.join(fixtures, "v32_tiny"), "--json"],
                   capture_output=True, text=True, timeout=120)
check(r.returncode == 0, f"info --json exits 0: {r.stderr[-1000:]}")
j = json.loads(r.stdout) if r.returncode == 0 else {}
groups = j.get("kv_groups", [])
check([g["name"] for g in groups] == ["latent", "indexer_keys"], f"v32 groups {groups}")
if len(groups) == 2:
    # v32_tiny: kv_lora 64 + rope 16 = 80, index_head_dim 32, 3 layers, BF16 rows on CUDA.
    check(groups[0]["row_dim"] == 80 and groups[0]["row_bytes_bf16"] == 160, f"latent row {groups[0]}")
    check(groups[1]["row_dim"] == 32 and groups[1]["row_bytes_f32"] == 128, f"indexer row {groups[1]}")
    check(all(g["num_layers"] == 3 and g["window"] == 0 and g["tokens_per_row"] == 1 for g in groups),
          "layers, window, tokens per row")
    check(j.get("kv_bytes_per_token_bf16") == 3 * (160 + 64), f"bytes per token {j.get('kv_bytes_per_token_bf16')}")
r = subprocess.run([binary, "info", "--model", os.path.join(fixtures, "v3_tiny")], capture_output=True,
                   text=True, timeout=120)
check(r.returncode == 0 and "KV groups              1," in r.stdout and "latent" in r.stdout,
      f"v3 text summary lists one latent group: {r.stdout[-800:]}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
