// Times ingot's core CUDA eager kernels with CUDA events (warm-up, then the median of repeated runs) and prints
// achieved bandwidth or FLOP rate; bench/cuda_kernels_torch.py times the same operations with PyTorch.
//   bench_cuda_kernels            (needs a GPU; prints one line per case: name, median ms, GB/s or TFLOP/s)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda_runtime.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/quant8.h"
#include "runtime/tensor.h"

using namespace ingot;
namespace kg = ingot::kernels::cuda;

namespace {

double median_ms(const std::function<void()>& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda::Event a, b;
    a.record(cuda::current_stream(0));
    fn();
    b.record(cuda::current_stream(0));
    b.synchronize();
    ms.push_back(a.elapsed_ms(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// AdamW's operands for `count` tensors of `size` elements: f32 parameters, bf16 gradients, f32 moments at zero.
struct AdamWLists {
  std::vector<Tensor> p, g, m1, m2;
};
AdamWLists adamw_lists(int count, int64_t size, Device dev) {
  AdamWLists l;
  for (int i = 0; i < count; ++i) {
    l.p.push_back(randn({size}, DType::f32, dev));
    l.g.push_back(randn({size}, DType::bf16, dev));
    l.m1.push_back(zeros({size}, DType::f32, dev));
    l.m2.push_back(zeros({size}, DType::f32, dev));
  }
  return l;
}

void report(const char* name, double ms, double bytes, double flops = 0) {
  if (flops > 0) std::printf("%-40s %9.3f ms %9.1f TFLOP/s\n", name, ms, flops / ms / 1e9);
  else std::printf("%-40s %9.3f ms %9.1f GB/s\n", name, ms, bytes / ms / 1e6);
}

}  // namespace

int main() {
  if (!cuda_available()) {
    std::printf("bench_cuda_kernels: no CUDA device\n");
    return 0;
  }
  const Device g = Device::cuda(0);
  const int64_t n = int64_t{1} << 26;  // 64 Mi elements
  {
    Tensor a = randn({n}, DType::f32, g), b = randn({n}, DType::f32, g), c = empty({n}, DType::f32, g);
    report("add f32 contiguous 64Mi", median_ms([&] { kg::binary(kernels::BinaryOp::Add, c, a, b); }), 12.0 * n);
    Tensor h = empty({n}, DType::bf16, g);
    report("copy f32->bf16 64Mi", median_ms([&] { kg::copy(h, a); }), 6.0 * n);
    Tensor hb = randn({n}, DType::bf16, g), hc = empty({n}, DType::bf16, g);
    report("mul bf16 contiguous 64Mi", median_ms([&] { kg::binary(kernels::BinaryOp::Mul, hc, hb, hb); }), 6.0 * n);
    report("gelu_tanh bf16 64Mi", median_ms([&] { kg::unary(kernels::UnaryOp::GeluTanh, hc, hb, 0); }), 4.0 * n);
    Tensor t = a.as_strided({8192, 8192}, {1, 8192}, 0), o = empty({8192, 8192}, DType::f32, g);
    report("copy f32 transposed 8192^2", median_ms([&] { kg::copy(o, t); }), 8.0 * n);
    Tensor row = randn({8192}, DType::f32, g).expand_raw({8192, 8192});
    report("add f32 row-broadcast 8192^2", median_ms([&] { kg::binary(kernels::BinaryOp::Add, o, a.as_strided({8192, 8192}, {8192, 1}, 0), row); }),
           8.0 * n);
    report("rand_normal f32 64Mi", median_ms([&] { kg::rand_normal(c, 1, 0, 0.0, 1.0); }), 4.0 * n);
    Tensor rs = empty({4096}, DType::f32, g);
    report("sum f32 [4096, 16384] last dim", median_ms([&] { kg::reduce(kernels::ReduceOp::Sum, rs, a, 4096, 16384, 1); }),
           4.0 * n);
    Tensor cs = empty({4096}, DType::f32, g);
    report("sum f32 [16384, 4096] first dim", median_ms([&] { kg::reduce(kernels::ReduceOp::Sum, cs, a, 1, 16384, 4096); }),
           4.0 * n);
    // GPT-2's bias gradients at batch 16 x 1024 (Note [Column sums]): bf16 in, f32 out.
    for (int64_t cols : {768, 2304}) {
      Tensor in = randn({16384, cols}, DType::bf16, g), out = empty({cols}, DType::f32, g);
      const std::string name = "column sum bf16 [16384, " + std::to_string(cols) + "]";
      report(name.c_str(), median_ms([&] { kg::reduce(kernels::ReduceOp::Sum, out, in, 1, 16384, cols); }),
             2.0 * 16384 * cols);
    }
    Tensor one = empty({1}, DType::f32, g);
    report("sum f32 64Mi to a scalar", median_ms([&] { kg::reduce(kernels::ReduceOp::Sum, one, a, 1, n, 1); }), 4.0 * n);
  }
  for (DType dt : {DType::bf16, DType::f32}) {
    const int64_t m = dt == DType::bf16 ? 8192 : 4096;
    Tensor a = randn({1, m, m}, dt, g), b = randn({1, m, m}, dt, g), c = empty({1, m, m}, dt, g);
    const double ms = median_ms([&] { kg::matmul(c, a, b, false, true, 1.0, 0.0); }, 10);
    report(dt == DType::bf16 ? "matmul bf16 8192^3 (a @ b^T)" : "matmul f32 4096^3 (no TF32)", ms, 0,
           2.0 * static_cast<double>(m) * m * m);
  }
  // RoPE on Llama-3-8B's q and k at 2 x 2048 tokens, token-major as the model keeps them ([B, T, H, D] memory seen as
  // [B, H, T, D]: Note [Rope keeps the token-major layout]): GB/s of x read and out written.
  for (int64_t heads : {32, 8}) {
    const int64_t b = 2, t = 2048, d = 128;
    Tensor x = randn({b, t, heads, d}, DType::bf16, g), o = empty({b, t, heads, d}, DType::bf16, g);
    Tensor cs = randn({t, d / 2}, DType::f32, g), sn = randn({t, d / 2}, DType::f32, g);
    const Strides st{t * heads * d, d, heads * d, 1};
    Tensor xv = x.as_strided({b, heads, t, d}, st, 0), ov = o.as_strided({b, heads, t, d}, st, 0);
    const std::string name = "rope bf16 token-major [2, " + std::to_string(heads) + ", 2048, 128]";
    report(name.c_str(), median_ms([&] { kg::rope(ov, xv, cs, sn, false, Tensor()); }), 4.0 * b * t * heads * d);
  }
  // Causal attention at Llama-3-8B's shape, 2 x 2048 tokens, q/k/v token-major ([B, T, H, D] memory seen as
  // [B, H, T, D], as the model hands them over), with its 8 kv heads (GQA) and with 32: FLOP/s counted as flash
  // attention's papers do (forward 2 products over the causal half, backward 2.5x the forward).
  for (int64_t kv_heads : {8, 32}) {
    const int64_t b = 2, t = 2048, hq = 32, d = 128;
    auto token_major = [&](int64_t heads) {
      return randn({b, t, heads, d}, DType::bf16, g).as_strided({b, heads, t, d}, {t * heads * d, d, heads * d, 1}, 0);
    };
    Tensor q = token_major(hq), k = token_major(kv_heads), v = token_major(kv_heads), out = token_major(hq);
    Tensor dout = token_major(hq), dq = token_major(hq), dk = token_major(kv_heads), dv = token_major(kv_heads);
    Tensor lse = empty({b, hq, t}, DType::f32, g), none;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const double fwd_flops = 4.0 * b * hq * t * t * d / 2;
    const std::string shape = "[2, 32/" + std::to_string(kv_heads) + ", 2048, 128]";
    report(("attention fwd causal bf16 " + shape).c_str(),
           median_ms([&] { kg::attention_fwd(out, lse, q, k, v, none, true, scale); }), 0, fwd_flops);
    report(("attention bwd causal bf16 " + shape).c_str(),
           median_ms([&] { kg::attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, none, true, scale); }), 0,
           2.5 * fwd_flops);
  }
  // LoRA r=8 products of Llama-3-8B at 2 x 2048 tokens: GB/s of the large operand read or written (its floor is the
  // memory's, ~8 us from HBM). Each repetition takes the next of kCopies large operands (kCopies x 32 MB, several
  // times the H200's 50 MB L2), so the large operand comes from HBM as it does in the step: with one operand it stayed
  // in L2 between repetitions, and kernels of our own that looked 1.2-1.6x faster than cuBLASLt here were no faster
  // in the step (bench/RESULTS.md 2026-11-27, twenty-first and twenty-seventh sessions).
  {
    const int64_t t = 4096, r = 8;
    constexpr int kCopies = 6;
    for (int64_t d : {4096, 1024}) {
      std::vector<Tensor> xs, bigs, big32s;
      for (int i = 0; i < kCopies; ++i) {
        xs.push_back(randn({1, t, d}, DType::bf16, g));
        bigs.push_back(randn({1, t, d}, DType::bf16, g));
        big32s.push_back(empty({1, t, d}, DType::f32, g));
      }
      int next = 0;
      auto pick = [&](std::vector<Tensor>& v) -> const Tensor& { return v[static_cast<size_t>(next++ % kCopies)]; };
      Tensor a = randn({1, r, d}, DType::bf16, g), bt = randn({1, d, r}, DType::bf16, g);
      Tensor h = randn({1, t, r}, DType::bf16, g), small = empty({1, t, r}, DType::bf16, g);
      const double bytes = 2.0 * t * d;
      const std::string sz = std::to_string(t) + "x" + std::to_string(d);
      auto time = [&](const std::string& name, double moved, const std::function<void()>& fn) {
        report(name.c_str(), median_ms(fn), moved);
      };
      time("lora x @ A^T " + sz + " -> r8", bytes, [&] { kg::matmul(small, pick(xs), a, false, true, 1.0, 0.0); });
      time("lora dY @ B " + sz + " -> r8", bytes, [&] { kg::matmul(small, pick(xs), bt, false, false, 1.0, 0.0); });
      time("lora h @ B^T r8 -> " + sz, bytes, [&] { kg::matmul(pick(bigs), h, bt, false, true, 1.0, 0.0); });
      time("lora dh @ A r8 -> " + sz, bytes, [&] { kg::matmul(pick(bigs), h, a, false, false, 1.0, 0.0); });
      // What the compiled step runs besides: the up-product into an f32 delta (Note [Residual of a sum]), the
      // input-gradient product accumulated into the base's (beta = 1: read and written), and q/k/v's shared rank-24
      // products (Note [Adapters of one input]).
      time("lora h @ B^T r8 -> " + sz + " f32", 2 * bytes,
           [&] { kg::matmul(pick(big32s), h, bt, false, true, 1.0, 0.0); });
      time("lora dh @ A r8 -> " + sz + " beta 1", 2 * bytes,
           [&] { kg::matmul(pick(bigs), h, a, false, false, 1.0, 1.0); });
      Tensor a24 = randn({1, 3 * r, d}, DType::bf16, g), h24 = randn({1, t, 3 * r}, DType::bf16, g);
      Tensor small24 = empty({1, t, 3 * r}, DType::bf16, g);
      time("lora x @ A^T " + sz + " -> r24", bytes, [&] { kg::matmul(small24, pick(xs), a24, false, true, 1.0, 0.0); });
      time("lora dh @ A r24 -> " + sz, bytes, [&] { kg::matmul(pick(bigs), h24, a24, false, false, 1.0, 0.0); });
    }
  }
  // Llama-3-8B's weight-gradient products at 2 x 2048 tokens (dW = dY^T @ X, K = 4096 tokens): bf16 out, and
  // widened to f32 out as compile/passes/cast_pieces.h makes them for an f32 reduction (cuBLASLt picks each
  // algorithm by its heuristic; the ratio says what writing f32 costs the product).
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {1024, 4096}, {14336, 4096},
                                                                     {4096, 14336}}) {
    const int64_t k = 4096;
    Tensor dy = randn({1, k, rows}, DType::bf16, g), x = randn({1, k, cols}, DType::bf16, g);
    Tensor narrow_out = empty({1, rows, cols}, DType::bf16, g), wide_out = empty({1, rows, cols}, DType::f32, g);
    const double flops = 2.0 * static_cast<double>(rows) * cols * k;
    const double bf = median_ms([&] { kg::matmul(narrow_out, dy, x, true, false, 1.0, 0.0); }, 10);
    const double wf = median_ms([&] { kg::matmul(wide_out, dy, x, true, false, 1.0, 0.0); }, 10);
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols) + "x" + std::to_string(k);
    report(("dW " + shape + " bf16 out").c_str(), bf, 0, flops);
    report(("dW " + shape + " f32 out").c_str(), wf, 0, flops);
    std::printf("%-40s %9.3f (f32 out / bf16 out)\n", ("dW " + shape + " ratio").c_str(), wf / bf);
  }
  {
    AdamWLists l = adamw_lists(100, 1 << 20, g);
    kernels::AdamWArgs args;
    const double bytes = 100.0 * (1 << 20) * (4 * 3 * 2 + 2);
    report("adamw_multi 100 x 1Mi (bf16 grads)", median_ms([&] { kg::adamw_multi(l.p, l.g, l.m1, l.m2, args); }), bytes);
  }
  {
    // AdamW with 8-bit moments (runtime/kernels/quant8.h) over 16 x 16 Mi parameters, f32 and bf16 (stochastically
    // rounded), bf16 gradients: the 8B full fine-tune's update (issue 24). Bytes: p read and written, g read, both
    // moments' codes read and written (absmax ~1%, not counted). The first warm-up call fills the moments.
    const int count = 16;
    const int64_t size = int64_t{16} << 20;
    const Tensor smap = quant8_map_tensor(quant8_signed_map(), g), umap = quant8_map_tensor(quant8_unsigned_map(), g);
    for (DType pd : {DType::f32, DType::bf16}) {
      std::vector<Tensor> p, gr, mc, ma, vc, va;
      for (int i = 0; i < count; ++i) {
        p.push_back(randn({size}, pd, g));
        gr.push_back(randn({size}, DType::bf16, g));
        mc.push_back(zeros({quant8_code_words(size)}, DType::i32, g));
        vc.push_back(zeros({quant8_code_words(size)}, DType::i32, g));
        ma.push_back(zeros({quant8_blocks(size)}, DType::f32, g));
        va.push_back(zeros({quant8_blocks(size)}, DType::f32, g));
      }
      kernels::AdamWArgs args;
      args.lr = 1e-4;
      args.weight_decay = 0.01;
      const double bytes = static_cast<double>(count) * size * (2.0 * static_cast<double>(itemsize(pd)) + 2 + 4);
      const std::string name = std::string("adamw8bit_multi 16 x 16Mi ") + (pd == DType::f32 ? "f32" : "bf16") + " p";
      report(name.c_str(),
             median_ms(
                 [&] {
                   ++args.step;
                   kg::adamw8bit_multi(p, gr, mc, ma, vc, va, smap, umap, args);
                 },
                 10),
             bytes);
    }
  }
  {
    // Could an optimizer update hide under the backward's products (issue 21's untried idea: updates on a side
    // stream)? Four bf16 8192^3 products (a stretch of a large model's backward) and AdamW over 200 Mi f32 parameters
    // with bf16 gradients (memory-bound), alone, one after the other on one stream, and at once on two streams.
    const int64_t m = 8192;
    Tensor a = randn({1, m, m}, DType::bf16, g), b = randn({1, m, m}, DType::bf16, g), c = empty({1, m, m}, DType::bf16, g);
    AdamWLists l = adamw_lists(100, 2 << 20, g);
    kernels::AdamWArgs args;
    auto products = [&] {
      for (int i = 0; i < 4; ++i) kg::matmul(c, a, b, false, true, 1.0, 0.0);
    };
    auto update = [&] { kg::adamw_multi(l.p, l.g, l.m1, l.m2, args); };
    const cuda::Stream compute = cuda::current_stream(0), side = cuda::create_stream(0);
    const double prod_ms = median_ms(products, 10), upd_ms = median_ms(update, 10);
    const double serial_ms = median_ms([&] { products(); update(); }, 10);
    const double overlap_ms = median_ms([&] {
      cuda::Event start, done;
      start.record(compute);
      start.wait(side);
      {
        cuda::StreamScope on_side(side);
        update();
      }
      products();
      done.record(side);
      done.wait(compute);
    }, 10);
    const double flops = 4 * 2.0 * static_cast<double>(m) * m * m, bytes = 100.0 * (2 << 20) * (4 * 3 * 2 + 2);
    report("4 x matmul bf16 8192^3 alone", prod_ms, 0, flops);
    report("adamw_multi 100 x 2Mi alone", upd_ms, bytes);
    std::printf("%-40s %9.3f ms (sum of the two alone %.3f)\n", "products then update, one stream", serial_ms,
                prod_ms + upd_ms);
    std::printf("%-40s %9.3f ms (%.0f%% of the update hidden)\n", "update on a side stream beside them", overlap_ms,
                100.0 * (serial_ms - overlap_ms) / upd_ms);
    cuda::destroy_stream(side);
  }
  {
    // GPT-2's loss at batch 16 x 1024: forward and backward in one pass, the gradient written over the logits
    // (as compiled steps do). Bytes: the logits read once and the gradient written once.
    const int64_t rows = 16384, classes = 50304;
    Tensor logits = randn({rows, classes}, DType::bf16, g), target = randint(0, classes, {rows}, g);
    Tensor loss = empty({rows}, DType::f32, g), lse = empty({rows}, DType::f32, g);
    Tensor dloss = full({rows}, 1.0 / rows, DType::f32, g);
    report("cross_entropy_fused bf16 16384 x 50304", median_ms([&] {
             kg::cross_entropy_fused(loss, lse, logits, logits, target, dloss, -100, 0.0);
           }),
           4.0 * rows * classes);
  }
  {
    // Note [Narrow wire, wide sum] (distributed/process_group.h): one 8B block's chunk at 4 ranks, 4 bf16 pieces of
    // 54.5 Mi summed into f32, on every SM and on the narrow wire's 32 and 16 blocks. Bytes: the pieces read, the
    // sum written.
    const int64_t chunk = 54525952;
    std::vector<Tensor> pieces;
    for (int k = 0; k < 4; ++k) pieces.push_back(randn({chunk}, DType::bf16, g));
    Tensor out = empty({chunk}, DType::f32, g);
    const double bytes = 4.0 * 2 * chunk + 4.0 * chunk;
    report("sum_pieces 4 x 54.5Mi bf16 -> f32", median_ms([&] { kg::sum_pieces(out, pieces, 0.25, 0); }), bytes);
    report("sum_pieces ... on 32 blocks", median_ms([&] { kg::sum_pieces(out, pieces, 0.25, 32); }), bytes);
    report("sum_pieces ... on 16 blocks", median_ms([&] { kg::sum_pieces(out, pieces, 0.25, 16); }), bytes);
  }
  std::printf("device allocator: %.1f MiB reserved, peak %.1f MiB allocated\n",
              static_cast<double>(cuda_allocator(0).stats().reserved_bytes) / (1 << 20),
              static_cast<double>(cuda_allocator(0).stats().peak_allocated_bytes) / (1 << 20));
  return 0;
}
