#!/usr/bin/env python3
"""transformers + peft reference for ingot's LoRA fine-tune on one GPU (issue 24): the config's causal LM (Llama, or
any model_type transformers knows, as bench/configs/qwen3_8b's Qwen3) with a bf16 base
from a Hugging Face checkpoint, peft LoRA (r 8, alpha 16, dropout 0, q/k/v/o by default; peft's default f32
adapters), bf16 autocast as transformers' Trainer runs it with bf16=True, mean causal-LM cross entropy, AdamW
(lr 1e-4, betas 0.9/0.999, no weight decay, fused) over the adapters. Eager and torch.compile(model). CUDA-event
timing after warm-up (median); one row per mode with tokens/s, MFU, the steady-state peak (after the first step, as
bench_llama_step and fsdp2_llama.py report it), the peak of the whole run (loading and the first step included),
the first step's time and the losses of the first steps.

Tokens follow fsdp2_llama.py (int32 ids, rows of seq + 1, read in order and cycled): with --rows equal to --batch
every step trains on the same batch, so the losses of the first steps compare one to one with ingot's
(`data.format: token_rows`, whose loader takes the same rows every step in some order: the mean is the same).

  python3 bench/reference/peft_lora.py --config bench/configs/llama_8b/config.json --checkpoint DIR --tokens FILE \\
      [--batch 2] [--seq 2048] [--steps 5] [--warmup 3] [--modes eager,compile] [--rank 8] [--alpha 16]
      [--targets q_proj,k_proj,v_proj,o_proj] [--dtype bf16|f32] [--no-autocast] [--peak-tflops 989]
  python3 bench/reference/peft_lora.py --config CONFIG --checkpoint DIR --tokens FILE --full [--grad-ckpt]
      no adapters: a full fine-tune in pure bf16 (bf16 weights, gradients and torch AdamW state, fused, no f32
      masters), the setting of torchtune's single-device full fine-tunes; ingot's side is
      bench/configs/llama_8b/full_finetune.yaml (scripts/device_lora.sh full full_torch)
  python3 bench/reference/peft_lora.py --config CONFIG --make-checkpoint DIR [--make-tokens FILE --rows N]
      random bf16 weights (built on the GPU when there is one: an 8B model initializes in seconds there, minutes on
      the CPU), saved with save_pretrained (safetensors), and N rows of random token ids; then exits.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp2_llama  # noqa: E402  (its checkpoint writer and token rows)


def load_base(args, cfg):
    torch.manual_seed(1234)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    if not args.checkpoint:
        with torch.device("cuda"):
            return AutoModelForCausalLM.from_config(cfg).to(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, torch_dtype=dtype)
    return model.cuda()


def run(mode, args, cfg):
    from peft import LoraConfig, get_peft_model

    torch.cuda.reset_peak_memory_stats()
    t_build = time.perf_counter()
    model = load_base(args, cfg)
    model.config.use_cache = False
    # from_pretrained leaves the model in eval mode, where transformers skips gradient checkpointing (its layers
    # check `self.training`): --grad-ckpt runs before 2026-11-28's thirty-fourth session never checkpointed.
    model.train()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not args.full:
        lcfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=args.targets.split(","),
                          bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
    build_s = time.perf_counter() - t_build
    n = sum(p.numel() for p in model.parameters())
    trained = [p for p in model.parameters() if p.requires_grad]
    n_trained = sum(p.numel() for p in trained)
    def adamw(params):
        return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)

    if args.optim_in_bwd:
        # torchtune's optimizer_in_bwd: one optimizer per parameter, stepped by a post-accumulate-grad hook as soon as
        # that parameter's gradient is complete, its gradient dropped right after (ingot: train.optimizer_in_backward).
        per_param = {p: adamw([p]) for p in trained}

        def update(p):
            per_param[p].step()
            per_param[p].zero_grad(set_to_none=True)

        for p in trained:
            p.register_post_accumulate_grad_hook(update)
        opt = None
    else:
        opt = adamw(trained)
    fwd = torch.compile(model) if mode == "compile" else model
    batches = fsdp2_llama.token_rows(args, 1, 0, cfg.vocab_size)

    def step():
        ids, targets = next(batches)
        with torch.autocast("cuda", dtype=torch.bfloat16,
                            enabled=not args.full and not args.no_autocast and args.dtype == "bf16"):
            logits = fwd(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    t0 = time.perf_counter()
    losses = [step().item()]
    first_s = time.perf_counter() - t0
    peak_all = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
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
    peak = torch.cuda.max_memory_allocated()
    peak_all = max(peak_all, peak)
    med = statistics.median(times)
    tokens = args.batch * args.seq
    # The products that run, as ingot's MFU counts them (recipes/metrics.cpp): 4 FLOPs per frozen weight and token
    # (forward and input gradient), 6 per adapter weight, none for the embedding lookup, attention 12 L T d.
    # A full fine-tune: 6 per weight but the embedding lookup's (which runs no product; a tied one is the head's).
    frozen = n - n_trained - cfg.vocab_size * cfg.hidden_size
    if args.full:
        frozen, n_trained = 0, n if cfg.tie_word_embeddings else n - cfg.vocab_size * cfg.hidden_size
    flops = tokens * (4 * frozen + 6 * n_trained + 12 * cfg.num_hidden_layers * args.seq * cfg.hidden_size)
    tflops = flops / med / 1e9
    name = ("torch full bf16" if args.full else "peft LoRA") + (" + torch.compile" if mode == "compile" else " eager")
    if args.grad_ckpt:
        name += " + checkpointing"
    if args.optim_in_bwd:
        name += " + optimizer in backward"
    precision = "bf16 weights" if args.full else "bf16" + ("" if args.no_autocast else " autocast")
    trains = "every weight" if args.full else f"r={args.rank} {args.targets}"
    print(f"| {name} | {torch.cuda.get_device_name()} | {precision} | "
          f"{args.batch} x {args.seq} | {trains} | {n_trained / 1e6:.2f}M of {n / 1e9:.2f}B | "
          f"{med:.1f} | {tokens / med * 1e3:.0f} | {tflops:.1f} | {100 * tflops / args.peak_tflops:.1f}% | "
          f"{peak / 1e9:.2f} | {peak_all / 1e9:.2f} | {first_s:.1f} | {build_s:.1f} | "
          f"{' '.join(f'{x:.4f}' for x in losses[:args.print_losses])} |", flush=True)
    del model, opt, fwd, trained
    torch.cuda.empty_cache()


def load_config(path):
    """The config.json at `path` as its model_type's config class (LlamaConfig, Qwen3Config, ...)."""
    with open(path) as f:
        d = json.load(f)
    return AutoConfig.for_model(d.pop("model_type", "llama"), **d)


def make_checkpoint(args, cfg):
    """fsdp2_llama's writer, with the model built on the GPU in bf16 when there is one."""
    a = copy.copy(args)
    a.make_tokens = ""
    if torch.cuda.is_available():
        torch.set_default_device("cuda")
        torch.set_default_dtype(torch.bfloat16)
    try:
        fsdp2_llama.make_checkpoint(a, cfg)
    finally:
        torch.set_default_device("cpu")
        torch.set_default_dtype(torch.float32)
    torch.cuda.empty_cache()
    if args.make_tokens:
        fsdp2_llama.write_tokens(args, cfg)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--tokens", default="")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=0, help="keep only the first N decoder layers (a quick check)")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                   help="the base's dtype; f32 runs everything in f32 without autocast (a parity check against ingot's "
                        "dtype: f32)")
    p.add_argument("--no-autocast", action="store_true", help="run the f32 adapters in f32 (peft without autocast)")
    p.add_argument("--print-losses", type=int, default=6)
    p.add_argument("--full", action="store_true", help="no adapters: every weight trains, pure bf16 (see above)")
    p.add_argument("--grad-ckpt", action="store_true", help="transformers' gradient checkpointing of every layer")
    p.add_argument("--optim-in-bwd", action="store_true",
                   help="torchtune's optimizer_in_bwd: each parameter's AdamW step in a post-accumulate-grad hook")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of one GPU (H100/H200 SXM: 989)")
    p.add_argument("--make-checkpoint", default="")
    p.add_argument("--make-tokens", default="")
    p.add_argument("--rows", type=int, default=2)
    args = p.parse_args()
    cfg = load_config(args.config)
    if args.layers:
        cfg.num_hidden_layers = args.layers
    # f32 parity runs: transformers' eager attention (exact f32 products) and no TF32 anywhere.
    cfg._attn_implementation = "eager" if args.dtype == "f32" else "sdpa"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.make_checkpoint:
        make_checkpoint(args, cfg)
        return
    import peft
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"{torch.cuda.get_device_name()}")
    print("| mode | device | dtype | batch x seq | adapters | trained of params | ms/step (median) | tokens/s | TFLOP/s | "
          "MFU | peak GB (steady) | peak GB (run) | first step s | load s | losses of the first steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in args.modes.split(","):
        run(m, args, cfg)


if __name__ == "__main__":
    main()
