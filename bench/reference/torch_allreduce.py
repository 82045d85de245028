"""All-reduce bandwidth of PyTorch's NCCL process group, measured like bench_allreduce (bench/allreduce.cpp):
f32 sum all-reduce of each size (doubling), median over --iters after 5 warm-up runs, CUDA events around the
collective on the current stream, and back to back (--iters collectives in a row between one pair of events,
divided). algbw = bytes / time; busbw = algbw * 2 (n - 1) / n; issue us: the host's median time inside
dist.all_reduce. Rank 0 prints the table.
   torchrun --standalone --nproc-per-node N bench/reference/torch_allreduce.py [--min-mb 32] [--max-mb 1024]
"""
import argparse, os, statistics, time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--min-mb", type=float, default=1)
    p.add_argument("--max-mb", type=float, default=1024)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print("| bytes | ranks | device | median ms | algbw GB/s | busbw GB/s | back-to-back ms | "
              "back-to-back busbw GB/s | issue us |\n|---|---|---|---|---|---|---|---|---|")
    mb = a.min_mb
    while mb <= a.max_mb:
        n = int(mb * (1 << 20) / 4)
        t = torch.ones(n, dtype=torch.float32, device=dev)
        times, issue = [], []
        for it in range(a.iters + 5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            h0 = time.perf_counter()
            dist.all_reduce(t)
            h1 = time.perf_counter()
            e1.record()
            e1.synchronize()
            if it >= 5:
                times.append(e0.elapsed_time(e1))
                issue.append((h1 - h0) * 1e6)
        med = sorted(times)[len(times) // 2]
        nbytes = n * 4
        algbw = nbytes / (med / 1e3) / 1e9
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for it in range(a.iters):
            dist.all_reduce(t)
        e1.record()
        e1.synchronize()
        b2b = e0.elapsed_time(e1) / a.iters
        b2b_bus = nbytes / (b2b / 1e3) / 1e9 * 2 * (world - 1) / world
        if rank == 0:
            print(f"| {nbytes} | {world} | cuda:{local} (torch) | {med:.3f} | {algbw:.1f} | {algbw * 2 * (world - 1) / world:.1f} "
                  f"| {b2b:.3f} | {b2b_bus:.1f} | {sorted(issue)[len(issue) // 2]:.1f} |")
        mb *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
