# PyTorch eager reference for bench/cuda_kernels.cpp: the same operations and sizes, timed the same way
# (CUDA events, 3 warm-up runs, median of 20). Run on the GPU machine: python3 bench/cuda_kernels_torch.py
import contextlib

import torch


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def report(name, ms, nbytes, flops=0.0):
    if flops:
        print(f"{name:<40} {ms:9.3f} ms {flops / ms / 1e9:9.1f} TFLOP/s")
    else:
        print(f"{name:<40} {ms:9.3f} ms {nbytes / ms / 1e6:9.1f} GB/s")


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 1 << 26
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    report("add f32 contiguous 64Mi", median_ms(lambda: torch.add(a, b, out=c)), 12 * n)
    h = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    report("copy f32->bf16 64Mi", median_ms(lambda: h.copy_(a)), 6 * n)
    hb, hc = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda", dtype=torch.bfloat16)
    report("mul bf16 contiguous 64Mi", median_ms(lambda: torch.mul(hb, hb, out=hc)), 6 * n)
    report("gelu_tanh bf16 64Mi", median_ms(lambda: torch.nn.functional.gelu(hb, approximate="tanh")), 4 * n)
    t, o = a.view(8192, 8192).t(), torch.empty(8192, 8192, device="cuda")
    report("copy f32 transposed 8192^2", median_ms(lambda: o.copy_(t)), 8 * n)
    row = torch.randn(8192, device="cuda")
    report("add f32 row-broadcast 8192^2", median_ms(lambda: torch.add(a.view(8192, 8192), row, out=o)), 8 * n)
    report("rand_normal f32 64Mi", median_ms(lambda: c.normal_()), 4 * n)
    report("sum f32 [4096, 16384] last dim", median_ms(lambda: a.view(4096, 16384).sum(1)), 4 * n)
    report("sum f32 [16384, 4096] first dim", median_ms(lambda: a.view(16384, 4096).sum(0)), 4 * n)
    report("sum f32 64Mi to a scalar", median_ms(lambda: a.sum()), 4 * n)
    for dt, m in ((torch.bfloat16, 8192), (torch.float32, 4096)):
        x, y = torch.randn(m, m, device="cuda", dtype=dt), torch.randn(m, m, device="cuda", dtype=dt)
        name = "matmul bf16 8192^3 (a @ b^T)" if dt == torch.bfloat16 else "matmul f32 4096^3 (no TF32)"
        report(name, median_ms(lambda: x @ y.t(), 10), 0, 2.0 * m * m * m)
    # Causal attention at Llama-3-8B's shape, token-major q/k/v as bench/cuda_kernels.cpp times ingot's; each
    # backend torch's SDPA offers (flash needs k/v heads expanded or enable_gqa), forward and backward apart.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for kv in (8, 32):
        b, t, hq, d = 2, 2048, 32, 128

        def tm(heads, grad=False):
            return torch.randn(b, t, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_(grad)

        fwd_flops = 4.0 * b * hq * t * t * d / 2
        # None: torch's own choice, what transformers' sdpa attention (peft's runs) gets.
        for backend in (None, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            q, k, v = tm(hq, True), tm(kv, True), tm(kv, True)
            dout = tm(hq)
            label = "default" if backend is None else backend.name.split('_')[0].lower()
            name = f"attention {{}} causal bf16 [2, 32/{kv}, 2048, 128] {label}"
            try:
                with (sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()):
                    def fwd():
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                enable_gqa=kv != hq)
                    f_ms = median_ms(fwd)
                    o = fwd()

                    def both():
                        out = fwd()
                        torch.autograd.grad(out, (q, k, v), dout)
                    b_ms = median_ms(both) - f_ms
                report(name.format("fwd"), f_ms, 0, fwd_flops)
                report(name.format("bwd"), b_ms, 0, 2.5 * fwd_flops)
                del o
            except RuntimeError as e:
                print(f"{name.format('fwd/bwd'):<40} unavailable: {str(e).splitlines()[0][:80]}")
    ps = [torch.randn(1 << 20, device="cuda") for _ in range(100)]
    gs = [torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16).float() for _ in range(100)]
    ms_ = [torch.zeros(1 << 20, device="cuda") for _ in range(100)]
    vs = [torch.zeros(1 << 20, device="cuda") for _ in range(100)]
    steps = [torch.tensor(1.0, device="cuda") for _ in range(100)]

    def adamw():
        torch._fused_adamw_(ps, gs, ms_, vs, [], steps, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0,
                            eps=1e-8, amsgrad=False, maximize=False)

    report("adamw fused 100 x 1Mi (f32 grads)", median_ms(adamw), 100.0 * (1 << 20) * (4 * 3 * 2 + 4))


if __name__ == "__main__":
    main()
