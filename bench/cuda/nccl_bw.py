"""NCCL's own bandwidth on this machine, the reference for deepinfer's collectives (issue 20 item 5):
all-reduce and all-to-all through PyTorch's NCCL process group (nccl-tests is not in the device
image), one process per GPU, started by torch.distributed.run. Bandwidths as nccl-tests reports
them: algbw = bytes / time, busbw = algbw x 2(n-1)/n (all-reduce) or x (n-1)/n (all-to-all).
Rank 0 prints one JSON line per (op, size) and writes them to --output.

  python3 -m torch.distributed.run --nproc-per-node N bench/cuda/nccl_bw.py --output nccl_bw.jsonl

Also times the all-to-all of the row sizes deepinfer's expert dispatch moves per MoE layer
(--rows: tokens x top-k rows of --hidden bf16 values), one rank's share spread evenly."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", default="nccl_bw.jsonl")
    ap.add_argument("--min-bytes", type=int, default=1 << 16)
    ap.add_argument("--max-bytes", type=int, default=1 << 28)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--rows", default="64,512,4096,32768", help="tokens x top-k rows per rank (comma list)")
    args = ap.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "set NCCL_NVLS_ENABLE=0 (NVLink multicast stays off)"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    n, rank = dist.get_world_size(), dist.get_rank()
    records = []

    def emit(rec):
        rec.update(world=n, device=torch.cuda.get_device_name(local))
        records.append(rec)
        if rank == 0:
            print(json.dumps(rec), flush=True)

    size = args.min_bytes
    while size <= args.max_bytes:
        x = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
        t = timed(lambda: dist.all_reduce(x), args.iters, args.warmup)
        emit(dict(op="all_reduce", bytes=size, us=t * 1e6, algbw_gbs=size / t / 1e9,
                  busbw_gbs=size / t / 1e9 * 2 * (n - 1) / n))
        out = torch.empty_like(x)
        t = timed(lambda: dist.all_to_all_single(out, x), args.iters, args.warmup)
        emit(dict(op="all_to_all", bytes=size, us=t * 1e6, algbw_gbs=size / t / 1e9,
                  busbw_gbs=size / t / 1e9 * (n - 1) / n))
        size *= 4
    for rows in (int(r) for r in args.rows.split(",")):
        rows -= rows % n
        x = torch.ones(rows, args.hidden, dtype=torch.bfloat16, device="cuda")
        out = torch.empty_like(x)
        t = timed(lambda: dist.all_to_all_single(out, x), args.iters, args.warmup)
        b = x.numel() * 2
        emit(dict(op="moe_dispatch_rows", rows=rows, hidden=args.hidden, bytes=b, us=t * 1e6,
                  algbw_gbs=b / t / 1e9, busbw_gbs=b / t / 1e9 * (n - 1) / n))
    if rank == 0:
        with open(args.output, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
