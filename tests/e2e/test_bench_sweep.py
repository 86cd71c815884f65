"""deepinfer bench --sweep / --prefill-batch / --contexts: Pareto records, and bench/plot_pareto.py
plotting them beside a peer's points and refusing to mix configurations."""
import json
import os
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
cfg = os.path.join(root, "tests/data/tiny_v3/config.json")
plot = os.path.join(root, "bench/plot_pareto.py")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "sweep.jsonl")
    r = subprocess.run([binary, "bench", "--config", cfg, "--random-weights", "--sweep", "--prefill", "16,32",
                        "--prefill-batch", "1,3", "--batch", "1,2", "--contexts", "8,16", "--gen-len", "4",
                        "--repeats", "1", "--warmup", "0", "--threads", "2", "--tag", "t:", "--output", out],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench --sweep failed: {r.stderr}")
    recs = [json.loads(l) for l in open(out)]
    got = [(x["kind"], x["prompt_len"], x["batch"], x["curve"]) for x in recs]
    want = [("prefill", 16, 1, "t:prefill len=16"), ("prefill", 16, 3, "t:prefill len=16"),
            ("prefill", 32, 1, "t:prefill len=32"), ("prefill", 32, 3, "t:prefill len=32"),
            ("decode", 8, 1, "t:decode ctx=8"), ("decode", 8, 2, "t:decode ctx=8"),
            ("decode", 16, 1, "t:decode ctx=16"), ("decode", 16, 2, "t:decode ctx=16")]
    assert got == want, got
    for x in recs:
        assert x["engine"] == "deepinfer" and x["parallel"] == "single-device", x
        if x["kind"] == "prefill":
            # Every prompt token counted once; the axes follow from the raw quantities.
            assert x["tokens"] == x["batch"] * x["prompt_len"], x
            assert abs(x["input_tokens_per_s"] - x["tokens"] / x["time_per_prefill_s"]) < 1e-6 * x["input_tokens_per_s"]
            assert x["time_per_prefill_s"] == x["elapsed_s"], x
        else:
            assert x["tokens"] == x["batch"] * 3, x  # gen 4: the timed part starts after the first token
            assert abs(x["per_user_tokens_per_s"] - x["tokens_per_s"] / x["batch"]) < 1e-6 * x["tokens_per_s"], x

    # llama.cpp's points (llama-batched-bench's JSONL, kind added as bench/cuda/vs_llamacpp_cuda.sh
    # does) go through bench/llamacpp_pareto.py beside ours: decode at context 8, prefill 16.
    conv = os.path.join(root, "bench/llamacpp_pareto.py")
    lb = os.path.join(tmp, "llamacpp.jsonl")
    with open(lb, "w") as f:
        for b, tps in ((1, 100.0), (2, 150.0)):
            f.write(json.dumps(dict(kind="decode", pp=8, tg=4, pl=b, t_tg=b * 4 / tps, speed_tg=tps)) + "\n")
        f.write(json.dumps(dict(kind="prefill", pp=16, tg=1, pl=1, t_pp=0.5, speed_pp=32.0)) + "\n")
    peer = os.path.join(tmp, "peer.jsonl")
    with open(peer, "w") as f:
        r = subprocess.run([sys.executable, conv, lb, out], stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prs = [json.loads(l) for l in open(peer)]
    assert [(x["engine"], x["kind"], x["batch"]) for x in prs] == [
        ("llama.cpp", "decode", 1), ("llama.cpp", "decode", 2), ("llama.cpp", "prefill", 1)], prs
    assert prs[1]["per_user_tokens_per_s"] == 75.0 and prs[1]["gen_len"] == 4, prs[1]
    assert prs[2]["time_per_prefill_s"] == 0.5 and prs[2]["input_tokens_per_s"] == 32.0, prs[2]
    # A llama.cpp run of another generation length, or a prompt length we did not measure, is refused.
    for bad_rec, why in ((dict(kind="decode", pp=8, tg=5, pl=1, t_tg=1.0, speed_tg=5.0), "generated 5"),
                         (dict(kind="prefill", pp=64, tg=1, pl=1, t_pp=1.0, speed_pp=64.0), "prompt length 64")):
        with open(lb, "w") as f:
            f.write(json.dumps(bad_rec) + "\n")
        r = subprocess.run([sys.executable, conv, lb, out], capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and why in r.stderr, (r.returncode, r.stderr)
    pdir = os.path.join(tmp, "plots")
    r = subprocess.run([sys.executable, plot, out, peer, "--out-dir", pdir], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    pngs = sorted(os.path.basename(p) for p in r.stdout.split())
    assert len(pngs) == 4, pngs  # prefill 16, prefill 32, decode ctx 8, decode ctx 16
    for p in pngs:
        assert os.path.getsize(os.path.join(pdir, p)) > 1000, p
    d8 = [p for p in pngs if p.startswith("decode-ctx8")]
    assert len(d8) == 1, pngs
    pts = json.load(open(os.path.join(pdir, d8[0][:-4] + ".json")))["points"]
    ours = sorted((p["batch"], p["tokens_per_s"]) for p in pts if p["engine"] == "deepinfer")
    assert ours == sorted((x["batch"], x["tokens_per_s"]) for x in recs[4:6]), ours
    assert sorted(p["batch"] for p in pts if p["engine"] == "llama.cpp") == [1, 2], pts
    p16 = [p for p in pngs if p.startswith("prefill-ctx16")]
    pts = json.load(open(os.path.join(pdir, p16[0][:-4] + ".json")))["points"]
    assert [(p["engine"], p["batch"]) for p in pts if p["engine"] == "llama.cpp"] == [("llama.cpp", 1)], pts

    # A curve whose records differ in dtype is refused, naming the field.
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        for i, x in enumerate(recs[4:6]):
            f.write(json.dumps(dict(x, dtype="fp8") if i else x) + "\n")
    r = subprocess.run([sys.executable, plot, bad, "--out-dir", pdir], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "different dtype" in r.stderr, (r.returncode, r.stderr)
    # Curves of two contexts on one plot are refused too.
    r = subprocess.run([sys.executable, plot, out, "--out-dir", pdir, "--curves", "t:decode ctx=8,t:decode ctx=16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "prompt_len" in r.stderr, (r.returncode, r.stderr)
print("ok")
