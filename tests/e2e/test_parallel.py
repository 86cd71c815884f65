"""Several processes on the CPU backend (issue 20): `mpirun -np 2 deepinfer generate` with
--tp 2 (heads and dense MLP split, MoE experts' intermediate split), --tp 2 --ep 2 (experts split
by expert), --tp 1 --ep 2 (attention replicated, experts split), --dp 2 and --dp 2 --ep 2 (each
rank attends its own requests), and on 4 processes --dp 2 --tp 2 [--ep 4] (two data-parallel
groups of two tensor-parallel ranks) on the embedded tiny model give the single-process greedy tokens; logprobs agree to fp32 rounding (the cross-rank sums
of --tp and --ep 1 reassociate o_proj's, down_proj's and the MoE's reductions, so they are not bitwise);
under DEEPINFER_BATCH_INVARIANT=1 a --tp 2, --dp 2 or --dp 2 --tp 2 --ep 4 run's logprobs are bitwise the same whether its
requests share steps or run one at a time (under --dp the MoE rows of the other rank's requests
share the step too), and --ep 2 and --dp 2 --ep 2 (the MoE's dispatch and combine by all_to_all_v,
model/expert_parallel.h; the latter with EPLB re-placing 4 redundant experts every 2 steps) give
the single-process logprobs bit for bit; impossible layouts and a bad
DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS fail naming the flag or the variable."""
import json
import os
import subprocess
import sys
import tempfile

binary, root, mpiexec = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
# On GPUs (one process per GPU, NCCL): DEEPINFER_PARALLEL_FLAGS="--backend cuda" and
# DEEPINFER_PARALLEL_LAYOUTS="ep2" (the tiny model's FP8 head shards cut 128-blocks, which the
# CUDA FP8 GEMMs refuse: --tp runs there on models whose shards fall on block edges).
extra_flags = os.environ.get("DEEPINFER_PARALLEL_FLAGS", "").split()
only_layouts = os.environ.get("DEEPINFER_PARALLEL_LAYOUTS", "").split()
model = os.path.join(root, "models/deepseek-v3-tiny-code")
# One thread per rank (2 ranks on CI's 2 cores); Open MPI as root, oversubscribed, shared memory.
env = dict(os.environ, DEEPINFER_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none",
           OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


prompts = ["def fib(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):"]


def generate(tmp, name, flags, np=0, extra_env=None, max_num_seqs=None):
    inp = os.path.join(tmp, name + ".in.jsonl")
    out = os.path.join(tmp, name + ".out.jsonl")
    with open(inp, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 1}) + "\n")
    cmd = [binary, "generate", "--model", model, "--input", inp, "--output", out, "--kv-cache-bytes", "16000000"]
    if max_num_seqs:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    cmd += flags + extra_flags
    if np:
        cmd = [mpiexec, "-np", str(np)] + cmd
    r = subprocess.run(cmd, env=dict(env, **(extra_env or {})), capture_output=True, timeout=600)
    if r.returncode != 0:
        return None, r
    rows = sorted((json.loads(l) for l in open(out)), key=lambda o: o["index"])
    return rows, r


def processes(flags):
    """mpirun -np of a layout: --tp x --dp, or --ep when larger (--tp 1 --ep W)."""
    v = {f: int(flags[i + 1]) for i, f in enumerate(flags) if f in ("--tp", "--ep", "--dp")}
    return max(v.get("--tp", 1) * v.get("--dp", 1), v.get("--ep", 1))


def tokens(rows):
    return [o["token_ids"] for o in rows]


def logprobs(rows):
    return [[t["logprob"] for t in o["logprobs"]] for o in rows]


with tempfile.TemporaryDirectory() as tmp:
    ref, r = generate(tmp, "single", [])
    check(ref is not None, f"single process: {r}")
    layouts = {"tp2": ["--tp", "2"], "tp2_ep2": ["--tp", "2", "--ep", "2"], "ep2": ["--ep", "2"],
               "dp2": ["--dp", "2"], "dp2_ep2": ["--dp", "2", "--ep", "2"],
               # 4 processes: 2 data-parallel groups of 2 tensor-parallel ranks (Communicator::split)
               "dp2_tp2": ["--dp", "2", "--tp", "2"], "dp2_tp2_ep4": ["--dp", "2", "--tp", "2", "--ep", "4"],
               # only when DEEPINFER_PARALLEL_LAYOUTS names them (4 GPUs)
               "ep4": ["--ep", "4"], "dp4_ep4": ["--dp", "4", "--ep", "4"]}
    for name, flags in layouts.items():
        if only_layouts and name not in only_layouts:
            continue
        if not only_layouts and name in ("ep2", "dp2_ep2", "ep4", "dp4_ep4"):
            continue  # on the CPU ep2 and dp2_ep2 run below, held to the single process's bits
        rows, r = generate(tmp, name, flags, np=processes(flags))
        check(rows is not None, f"{name}: mpirun failed: {r.returncode} {r.stderr.decode()[-2000:]}")
        if rows is None or ref is None:
            continue
        check(tokens(rows) == tokens(ref), f"{name}: greedy tokens {tokens(rows)} != single process {tokens(ref)}")
        diff = max(abs(a - b) for x, y in zip(logprobs(rows), logprobs(ref)) for a, b in zip(x, y))
        print(f"{name}: tokens equal, max |logprob - single| = {diff:.3g}")
        check(diff < 1e-3, f"{name}: logprobs differ from the single process by {diff}")

    # Batch invariance under --tp 2: the same bits whether the requests share steps or not.
    # (--dp 2 --tp 2 --ep 4 on 4 processes: the groups' heads split, the experts' dispatch in chunks.)
    bi = {"DEEPINFER_BATCH_INVARIANT": "1"}
    bi_layouts = ([["--tp", "2"], ["--dp", "2"], ["--dp", "2", "--tp", "2", "--ep", "4"]] if not only_layouts
                  else [layouts[n] for n in only_layouts if n in layouts])
    for bi_layout in bi_layouts:
        name = " ".join(bi_layout)
        np = processes(bi_layout)
        batched, r = generate(tmp, "bi_batched", bi_layout, np=np, extra_env=bi)
        check(batched is not None, f"{name} batch-invariant: {r}")
        alone, r = generate(tmp, "bi_alone", bi_layout, np=np, extra_env=bi, max_num_seqs=1)
        check(alone is not None, f"{name} batch-invariant, one sequence per step: {r}")
        if batched and alone:
            check(logprobs(batched) == logprobs(alone), f"{name} under DEEPINFER_BATCH_INVARIANT=1: logprobs depend "
                  "on which requests share a step")
            check(tokens(batched) == tokens(ref), f"{name} batch-invariant: tokens differ from the single process")

    # Expert parallelism's dispatch: the single-process bits under DEEPINFER_BATCH_INVARIANT=1, with
    # EPLB (DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS=3 rounds up to 4 over --ep 2; re-placed every 2 steps,
    # the effective value logged) in the --dp run.
    bi_single, r = generate(tmp, "bi_single", [], extra_env=bi)
    check(bi_single is not None, f"single process, batch-invariant: {r}")
    eplb = dict(bi, DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS="3", DEEPINFER_EPLB_INTERVAL="2", DEEPINFER_LOG="info")
    for name, flags, extra_env in [("ep2", ["--ep", "2"], bi), ("dp2_ep2 eplb", ["--dp", "2", "--ep", "2"], eplb),
                                   ("ep4", ["--ep", "4"], bi), ("dp4_ep4 eplb", ["--dp", "4", "--ep", "4"], eplb)]:
        base = name.split()[0]
        if (only_layouts and base not in only_layouts) or (not only_layouts and base in ("ep4", "dp4_ep4")):
            continue
        rows, r = generate(tmp, "bi_" + base, flags, np=processes(flags), extra_env=extra_env)
        check(rows is not None, f"{name} batch-invariant: mpirun failed: {r.returncode} {r.stderr.decode()[-2000:]}")
        if rows is None or bi_single is None:
            continue
        check(tokens(rows) == tokens(bi_single), f"{name} batch-invariant: tokens differ from the single process")
        check(logprobs(rows) == logprobs(bi_single), f"{name} under DEEPINFER_BATCH_INVARIANT=1: logprobs are not the "
              "single process's bits")
        if "eplb" in name:  # 3 rounded up to 4 over --ep 2 and --ep 4
            check("EPLB: 4 redundant experts (DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS=3" in r.stderr.decode(),
                  f"{name}: the effective number of redundant experts is not logged: {r.stderr.decode()[-1000:]}")
        print(f"{name}: logprobs bitwise equal to the single process")

    # Impossible layouts: errors that name the flag.
    for flags, np, needle in [(["--tp", "2"], 0, "mpirun"), (["--tp", "4"], 2, "--tp 4"),
                              (["--dp", "2", "--tp", "2"], 2, "--tp 2 x --dp 2 must equal the 2 processes"),
                              (["--dp", "2"], 0, "--dp 2: one process"), (["--ep", "3"], 2, "--ep 3")]:
        rows, r = generate(tmp, "bad", flags, np=np)
        err = r.stderr.decode()
        check(rows is None and needle in err, f"{flags} on {np or 1} process(es): expected an error naming "
              f"'{needle}', got {r.returncode}: {err[-500:]}")
    # A bad number of redundant experts (read before anything loads; one process is enough).
    rows, r = generate(tmp, "bad", ["--ep", "2"], extra_env={"DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS": "-2"})
    check(rows is None and "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS" in r.stderr.decode(),
          f"DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS=-2: expected an error naming it, got {r.returncode}: "
          f"{r.stderr.decode()[-500:]}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
