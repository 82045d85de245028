#!/usr/bin/env python3
"""PyTorch reference for bench/gpt2_step.cpp: the same GPT-2 step (forward, mean CE, backward, fused AdamW,
zero_grad) on random tokens, eager and torch.compile, bf16 autocast with f32 params. Times with CUDA events
after warm-up and prints the median in the same table format.

usage: python3 bench/reference/torch_gpt2.py [--batch 16] [--seq 1024] [--layers 12] [--steps 20] [--modes eager,compile]
       [--kernels K]   after timing, one more step under torch.profiler: the K kernels with the most GPU time
       [--peak-tflops P]  the MFU column's dense bf16 rate (default 989.4: an H100 / H200 SXM's datasheet rate)
       [--init gpt2|torch]  gpt2 (default): GPT-2's initialization, as bench_gpt2_step's model has it (normal(0, 0.02)
                       weights and embeddings, zero biases, residual projections 0.02 / sqrt(2 * layers)); torch:
                       PyTorch's module defaults (embeddings normal(0, 1), so the tied head's logits start 50x
                       larger), which the tables in bench/RESULTS.md before 2026-11-24 (ninth session) used
Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel over NCCL, --batch is per GPU,
and rank 0 prints tokens/s per GPU (the median step time of rank 0; DDP steps are synchronous).
"""
import argparse, math, os, statistics, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, embd, init="gpt2"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(seq, embd)
        self.h = nn.ModuleList([Block(embd, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(embd)
        if init == "gpt2":  # models/gpt2.cpp's initialization
            for name, m in self.named_modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    proj = name.endswith("c_proj") or name.endswith("mlp_proj")
                    nn.init.normal_(m.weight, 0.0, 0.02 / math.sqrt(2 * layers) if proj else 0.02)
                    if isinstance(m, nn.Linear) and m.bias is not None:
                        nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def print_kernels(step, k, name):
    """One step under torch.profiler; GPU time per kernel name (the same table as ncu_summary.py)."""
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    tot, cnt = {}, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.name] = tot.get(e.name, 0.0) + e.device_time
            cnt[e.name] = cnt.get(e.name, 0) + 1
    total = sum(tot.values())
    print(f"## {name}: {sum(cnt.values())} kernels, {total / 1e3:.2f} ms GPU time in one step")
    for n, t in sorted(tot.items(), key=lambda x: -x[1])[:k]:
        print(f"{t / 1e3:9.3f} ms {cnt[n]:5d}x  {n[:110]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--kernels", type=int, default=0)
    p.add_argument("--init", choices=["gpt2", "torch"], default="gpt2")
    p.add_argument("--peak-tflops", type=float, default=989.4)  # the MFU column's rate: H100 / H200 SXM dense bf16
    a = p.parse_args()
    torch.manual_seed(1234)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = "cuda"
    if world > 1:
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
        dist.init_process_group("nccl", device_id=torch.device(dev))
    for mode in a.modes.split(","):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = GPT(a.vocab, a.seq, a.layers, a.heads, a.embd, a.init).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
        data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)
        ids, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        if mode == "compile":
            step = torch.compile(step)
        t0 = time.time()
        step()
        torch.cuda.synchronize()
        first_s = time.time() - t0
        # Peak memory of the steady-state steps, as bench_gpt2_step reports it (the first call compiles).
        torch.cuda.reset_peak_memory_stats()
        for _ in range(a.warmup):
            step()
        def timed_steps(rest_ms=0.0):
            # Each step between CUDA events, synchronized after it; with rest_ms, queued behind a GPU spin first.
            ms = []
            for _ in range(a.steps):
                if rest_ms > 0:
                    torch.cuda._sleep(int(rest_ms * 1e-3 * 1.98e9))
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                loss = step()
                e1.record()
                e1.synchronize()
                ms.append(e0.elapsed_time(e1))
            return statistics.median(ms), loss

        med, loss = timed_steps()
        last_loss = loss.item()  # the table's loss: that of the timed steps, as bench_gpt2_step reports it
        # The same two extra timings as bench_gpt2_step: steps queued back to back (no sync between them), and
        # each step queued whole behind a 5 ms GPU spin (torch.cuda._sleep) so the GPU starts it after a rest.
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(a.steps):
            loss = step()
        e1.record()
        e1.synchronize()
        back_to_back = e0.elapsed_time(e1) / a.steps
        queued, _ = timed_steps(rest_ms=5.0)
        n = sum(p.numel() for p in model.parameters())
        tokens = a.batch * a.seq
        flops = tokens * (6 * n + 6 * a.layers * a.seq * a.embd)
        name = f"torch {mode}" + (f" DDP x{world}" if world > 1 else "")
        name += " (torch init)" if a.init == "torch" else ""
        if rank == 0:
            tflops = flops / (med / 1e3) / 1e12
            print(f"| {name} | {torch.cuda.get_device_name()} | bf16 | {a.batch} x {a.seq} | {n/1e6:.1f}M | {med:.2f} | "
                  f"{tokens/(med/1e3):.0f} | {tflops:.1f} | {100 * tflops / a.peak_tflops:.0f}% | "
                  f"{torch.cuda.max_memory_allocated()/1e9:.2f} | "
                  f"first call {first_s:.1f}s, loss {last_loss:.3f} |", flush=True)
        if rank == 0:
            print(f"timing: {name}: {med:.2f} ms/step with a sync after each step, {back_to_back:.2f} ms back to back, "
                  f"{queued:.2f} ms (median) queued whole before the GPU starts it", flush=True)
        if a.kernels > 0 and rank == 0:
            print_kernels(step, a.kernels, name)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
