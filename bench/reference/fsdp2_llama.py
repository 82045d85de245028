#!/usr/bin/env python3
"""PyTorch FSDP2 reference for ingot's fully sharded data parallel (issue 22): a Llama full fine-tune under torchrun
with `fully_shard` on every decoder layer and on the root, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32)
over f32 sharded parameters (f32 masters, bf16 compute), fused AdamW over the shards, mean causal-LM cross entropy;
`--modes compile` also compiles every decoder layer with torch.compile (torchtitan's per-block compile). CUDA-event
timing after warm-up, median; rank 0 prints one row in hf_llama.py's table format plus tokens/s per GPU, MFU
against --peak-tflops and the losses of the first steps (to compare with ingot on the same weights and tokens).

Weights: --checkpoint DIR (a Hugging Face checkpoint, e.g. one written by --make-checkpoint) or random from
--config (seed 1234, the same on every rank). Either is built on the CPU in f32 and sharded by fully_shard, which
moves each rank's shards to its GPU: no GPU ever holds the whole model. Tokens: --tokens FILE (int32 ids, rows of
seq + 1; rank r reads rows r*batch .. r*batch + batch - 1 of step 0, then the next world*batch rows each step, cycling)
or random (seed 4321 + rank).

  torchrun --standalone --nproc-per-node 4 bench/reference/fsdp2_llama.py --config bench/configs/llama_8b/config.json \\
      [--checkpoint DIR] [--tokens FILE] [--batch 2] [--seq 2048] [--steps 10] [--warmup 3] [--modes eager,compile]
      [--peak-tflops 989] [--pure-bf16] [--grad-ckpt]
  python3 bench/reference/fsdp2_llama.py --config CONFIG --make-checkpoint DIR [--make-tokens FILE --rows N]
      writes random bf16 weights (save_pretrained, safetensors) and optionally N rows of random token ids, then exits.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def fully_shard_api():
    try:  # torch >= 2.6
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def build_model(args, cfg):
    torch.manual_seed(1234)
    if args.checkpoint:
        dtype = torch.bfloat16 if args.pure_bf16 else torch.float32
        model = LlamaForCausalLM.from_pretrained(args.checkpoint, torch_dtype=dtype)
    else:
        model = LlamaForCausalLM(cfg).float()
    model.config.use_cache = False
    return model


def token_rows(args, world, rank, vocab):
    """Yields (ids, targets) on the GPU for each step."""
    if args.tokens:
        data = torch.from_numpy(__import__("numpy").fromfile(args.tokens, dtype="int32")).long()
        rows = data.numel() // (args.seq + 1)
        assert rows >= world * args.batch, f"{args.tokens}: {rows} rows of {args.seq + 1} tokens, need {world * args.batch}"
        data = data[: rows * (args.seq + 1)].view(rows, args.seq + 1)
        step = 0
        while True:
            first = (step * world + rank) * args.batch
            idx = torch.arange(first, first + args.batch) % rows
            batch = data[idx].cuda(non_blocking=True)
            yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
            step += 1
    g = torch.Generator(device="cuda").manual_seed(4321 + rank)
    while True:
        batch = torch.randint(0, vocab, (args.batch, args.seq + 1), device="cuda", generator=g)
        yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def run(mode, args, cfg, world, rank):
    fully_shard, MixedPrecisionPolicy = fully_shard_api()
    t_build = time.perf_counter()
    model = build_model(args, cfg)
    n = sum(p.numel() for p in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if args.pure_bf16:
        # torchtune's full_finetune_distributed: bf16 parameters sharded as they are (no f32 masters), gradients
        # reduced in bf16, AdamW's state in bf16 (it follows the parameters' dtype).
        model.to(torch.bfloat16)
        mp = MixedPrecisionPolicy()
    # from_pretrained leaves the model in eval mode, where transformers skips gradient checkpointing (its layers
    # check `self.training`): the runs before 2026-11-28's thirty-fourth session never checkpointed.
    model.train()
    if args.grad_ckpt:
        # Each decoder layer's forward runs again in its backward (torch.utils.checkpoint, non-reentrant).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for i, layer in enumerate(model.model.layers):
        if mode == "compile":
            layer.compile()
        # The last layer's parameters are needed again at once by the backward: keep them gathered (torchtitan).
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(model.model.layers) - 1)
    fully_shard(model, mp_policy=mp)
    build_s = time.perf_counter() - t_build
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    batches = token_rows(args, world, rank, cfg.vocab_size)

    def step():
        ids, targets = next(batches)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        # The mean over ranks: the global batch's loss, as ingot prints it.
        l = loss.detach().clone()
        dist.all_reduce(l, op=dist.ReduceOp.AVG)
        return l

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    losses = [step().item()]
    first_s = time.perf_counter() - t0
    first_peak = torch.cuda.max_memory_allocated() / 1e9  # the first step's (compile included), printed below
    torch.cuda.reset_peak_memory_stats()  # steady-state peak, as bench_llama_step reports it
    times = []
    for i in range(args.warmup - 1 + args.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = step()
        e1.record()
        e1.synchronize()
        losses.append(loss.item())
        if i >= args.warmup - 1:
            times.append(e0.elapsed_time(e1))
    med = statistics.median(times)
    tokens = args.batch * args.seq
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # 6 FLOPs per weight and token (forward + both backward products) plus causal attention's QK^T and PV.
    flops = tokens * (6 * n + 6 * cfg.num_hidden_layers * args.seq * cfg.num_attention_heads * hd)
    tflops = flops / med / 1e9
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 1e9, first_peak], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    name = ("transformers FSDP2" if mode == "eager" else "transformers FSDP2 + torch.compile per layer") + f" x{world}"
    name += " pure bf16" if args.pure_bf16 else ""
    name += " + checkpointing" if args.grad_ckpt else ""
    if rank == 0:
        print(f"| {name} | cuda:0 | bf16 | {args.batch} x {args.seq} | {n / 1e6:.1f}M | {med:.2f} | "
              f"{tokens / med * 1e3:.0f} | {tflops:.1f} | {100 * tflops / args.peak_tflops:.1f}% | {peak[0].item():.2f} | "
              f"{first_s:.2f} | {build_s:.1f} | {' '.join(f'{l:.4f}' for l in losses[:10])} |", flush=True)
        print(f"first step: peak {peak[1].item():.2f} GB (max over ranks; the table's peak is the later steps')",
              flush=True)
    del model, opt
    torch.cuda.empty_cache()


def make_checkpoint(args, cfg):
    # Made in bf16 on the GPU when there is one: an 8B model initialized in f32 on the CPU took ~110 s of a 4-GPU
    # call (bench/RESULTS.md 2026-11-27), on the GPU it is seconds; the weights are random either way.
    torch.manual_seed(1234)
    prev = torch.get_default_dtype()
    # (Different random weights from the f32-on-CPU ones of sessions before 2026-11-27's twentieth: losses are
    # comparable within one call, not with earlier rows.)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            # The config's own class: LlamaForCausalLM for a LlamaConfig, Qwen3ForCausalLM for peft_lora.py's Qwen3.
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.save_pretrained(args.make_checkpoint, safe_serialization=True)
    print(f"wrote {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters (bf16) to {args.make_checkpoint}")
    if args.make_tokens:
        write_tokens(args, cfg)


def write_tokens(args, cfg):
    """args.rows rows of args.seq + 1 random int32 token ids (seed 4321) into args.make_tokens: the --tokens format."""
    g = torch.Generator().manual_seed(4321)
    ids = torch.randint(0, cfg.vocab_size, (args.rows, args.seq + 1), generator=g, dtype=torch.int32)
    ids.numpy().tofile(args.make_tokens)
    print(f"wrote {args.rows} rows of {args.seq + 1} token ids (int32) to {args.make_tokens}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--tokens", default="")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=0, help="keep only the first N decoder layers (a quick check)")
    p.add_argument("--modes", default="compile")
    p.add_argument("--pure-bf16", action="store_true",
                   help="bf16 parameters, gradients and AdamW state, no f32 masters (torchtune's full fine-tune)")
    p.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing of every decoder layer")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of one GPU (H100/H200 SXM: 989)")
    p.add_argument("--make-checkpoint", default="")
    p.add_argument("--make-tokens", default="")
    p.add_argument("--rows", type=int, default=64)
    args = p.parse_args()
    cfg = LlamaConfig.from_json_file(args.config)
    if args.layers:
        cfg.num_hidden_layers = args.layers
    cfg._attn_implementation = "sdpa"
    if args.make_checkpoint:
        make_checkpoint(args, cfg)
        return
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import transformers
    if rank == 0:
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}, "
              f"{world} ranks")
        print("| mode | device | dtype | batch x seq per GPU | params | ms/step (median) | tokens/s per GPU | TFLOP/s "
              "per GPU | MFU | peak mem GB (max over ranks) | first step s | build + shard s | losses of the first "
              "steps |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in args.modes.split(","):
        run(m, args, cfg, world, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
