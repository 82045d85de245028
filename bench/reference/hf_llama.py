#!/usr/bin/env python3
"""transformers reference for bench/llama_step.cpp: the same full fine-tune step (forward, mean causal-LM cross
entropy, backward, fused AdamW, zero_grad) of LlamaForCausalLM built from the same config.json with random
weights, on random tokens; f32 weights with bf16 autocast (the recipe ingot's bf16 uses), SDPA attention.
Eager and torch.compile(model); CUDA-event timing after warm-up; prints the median in the same table format.
Under torchrun (WORLD_SIZE > 1) the model is wrapped in DistributedDataParallel (NCCL, --bucket-cap-mb, optionally
--bf16-compress: PyTorch's bf16_compress_hook), --batch is per rank and rank 0 prints the row: the reference for
`ingot launch ... bench_llama_step` (scripts/device_dist.sh llama).

usage: python3 bench/reference/hf_llama.py --config bench/configs/llama_1b/config.json [--batch 2] [--seq 2048]
                                           [--steps 20] [--warmup 5] [--modes eager,compile] [--layers N]
       torchrun --standalone --nproc-per-node 4 bench/reference/hf_llama.py --config ... [--bucket-cap-mb 25]
                                           [--bf16-compress]
"""
import argparse, os, statistics, time
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def run(mode, args, cfg, world, rank):
    torch.manual_seed(1234 + rank)
    model = LlamaForCausalLM(cfg).cuda().float()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    wrapped = model
    if world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                                            bucket_cap_mb=args.bucket_cap_mb)
        if args.bf16_compress:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
    fwd = torch.compile(wrapped) if mode == "compile" else wrapped
    data = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device="cuda")
    ids, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    first = step().item()
    first_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()  # steady-state peak, as bench_llama_step reports it
    times, last = [], first
    for i in range(args.warmup - 1 + args.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = step()
        e1.record()
        e1.synchronize()
        last = loss.item()
        if i >= args.warmup - 1:
            times.append(e0.elapsed_time(e1))
    med = statistics.median(times)
    n = sum(p.numel() for p in model.parameters())
    tokens = args.batch * args.seq
    hd = cfg.hidden_size // cfg.num_attention_heads if getattr(cfg, "head_dim", None) is None else cfg.head_dim
    flops = tokens * (6 * n + 6 * cfg.num_hidden_layers * args.seq * cfg.num_attention_heads * hd)
    name = "transformers eager" if mode == "eager" else "transformers torch.compile"
    if world > 1:
        name += f" DDP x{world}" + (" bf16 compress" if args.bf16_compress else "")
    if rank == 0:
        print(f"| {name} | cuda:0 | bf16 | {args.batch} x {args.seq} | {n / 1e6:.1f}M | {med:.2f} | {tokens / med * 1e3:.0f} | "
              f"{flops / med / 1e9:.1f} | {torch.cuda.max_memory_allocated() / 1e9:.2f} | {first_s:.2f} | "
              f"{first:.3f} -> {last:.3f} |", flush=True)
    del model, wrapped, opt, fwd
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--bf16-compress", action="store_true")
    args = p.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    cfg = LlamaConfig.from_json_file(args.config)
    if args.layers:
        cfg.num_hidden_layers = args.layers
    cfg._attn_implementation = "sdpa"
    import transformers
    if rank == 0:
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
        print("| mode | device | dtype | batch x seq | params | ms/step (median) | tokens/s | TFLOP/s | peak mem GB | "
              "first call s | loss first->last |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in args.modes.split(","):
        run(m, args, cfg, world, rank)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
