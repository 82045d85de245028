// Collective bandwidth of ingot's process group (NCCL on GPUs, Gloo on CPUs), like nccl-tests' all_reduce_perf:
//   ingot launch --nproc-per-node N -- bench_allreduce [--device cuda|cpu] [--op all_reduce|reduce_scatter|
//       reduce_scatter_widen|all_to_all] [--dtype f32|bf16] [--min-mb 1] [--max-mb 1024] [--iters 20] [--symmetric]
//       [--beside-matmul N]
// For each size (the input's bytes, doubling), a sum: all_reduce in place, reduce_scatter into a chunk of the same
// dtype, or reduce_scatter_widen (a bf16 input summed into an f32 chunk: Note [Narrow wire, wide sum],
// distributed/process_group.h; its environment switches INGOT_NARROW_WIRE and INGOT_NARROW_WIRE_BLOCKS apply); or
// all_to_all, the widened reduce-scatter's exchange alone (no sum);
// median over --iters after 5 warm-up runs, timed with CUDA events on the group's work (host clock on CPU). algbw =
// input bytes / time; busbw = algbw * 2 (n - 1) / n for the all-reduce and algbw * (n - 1) / n for the
// reduce-scatters and the all-to-all, the figure that compares across world sizes. Each timed run includes issuing the collective from
// the host; the back-to-back columns time --iters collectives issued in a row and divide (nccl-tests' way: the issue
// overlaps the previous collective, so only the device's throughput is left). The issue column is the host's median
// time inside the call (queueing it, not running it). Rank 0 prints the table.
// --symmetric: the buffers come from ProcessGroup::symmetric_empty (NCCL windows registered with
// NCCL_WIN_COLL_SYMMETRIC: NCCL's symmetric kernels, direct loads over NVLink, sums in f32). --beside-matmul N: the
// question of issue 21 / 22 (compute slows while NCCL's kernels are resident): an N x N x N bf16 product timed alone
// and while the collective runs back to back beside it; the row adds both medians and the slowdown.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "bench/cli.h"
#include "distributed/bootstrap.h"
#include "runtime/cuda_runtime.h"
#include "runtime/tensor.h"

using namespace ingot;

int main(int argc, char** argv) try {
  std::string device = "cuda", op = "all_reduce", dtype = "f32";
  double min_mb = 1, max_mb = 1024;
  int iters = 20;
  bool symmetric = false;
  int64_t beside = 0;
  CLI::App app{"Collective bandwidth of ingot's process group (a sum, input sizes doubling from --min-mb to --max-mb).",
               "bench_allreduce"};
  app.add_option("--device", device, "cuda (NCCL) or cpu (Gloo)")->capture_default_str();
  app.add_option("--op", op,
                 "all_reduce, reduce_scatter, reduce_scatter_widen (bf16 in, f32 out), or all_to_all (its exchange)")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "reduce_scatter_widen", "all_to_all"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "the input's dtype (reduce_scatter_widen: bf16)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--min-mb", min_mb, "smallest size, MiB")->capture_default_str();
  app.add_option("--max-mb", max_mb, "largest size, MiB")->capture_default_str();
  app.add_option("--iters", iters, "timed runs per size (after 5 warm-up)")->capture_default_str();
  app.add_flag("--symmetric", symmetric, "buffers in NCCL symmetric windows (ProcessGroup::symmetric_empty)");
  app.add_option("--beside-matmul", beside, "also time an N x N x N bf16 product alone and beside the collective (0: off)")
      ->capture_default_str();
  bench::parse_or_exit(app, argc, argv);
  if (op == "reduce_scatter_widen" && dtype != "bf16") {
    std::fprintf(stderr, "bench_allreduce: --op reduce_scatter_widen sums a bf16 input into f32: use --dtype bf16\n");
    return 2;
  }
  const DType in_dtype = dtype == "bf16" ? DType::bf16 : DType::f32;
  distributed::InitOptions opts;
  opts.backend = device == "cpu" ? "gloo" : "nccl";
  distributed::DistributedContext ctx = distributed::init_distributed(opts);
  const int world = ctx.info.world_size;
  Device dev = parse_device(device);
  if (dev.is_cuda() && cuda_device_count() > 1) dev = Device::cuda(ctx.info.local_rank);
  if (ctx.info.rank == 0)
    std::printf("| op | dtype | bytes | ranks | device | median ms | algbw GB/s | busbw GB/s | back-to-back ms | "
                "back-to-back busbw GB/s | issue us |%s\n|---|---|---|---|---|---|---|---|---|---|---|%s\n",
                beside > 0 ? " product alone ms | product beside ms | slower |" : "", beside > 0 ? "---|---|---|" : "");
  const bool all_reduce = op == "all_reduce";
  for (double mb = min_mb; mb <= max_mb; mb *= 2) {
    // Whole chunks for the reduce-scatters.
    const int64_t n = static_cast<int64_t>(mb * (1 << 20) / static_cast<double>(itemsize(in_dtype))) / world * world;
    auto make = [&](int64_t numel, DType dt) {
      return symmetric && dev.is_cuda() ? ctx.group->symmetric_empty({numel}, dt, dev) : empty({numel}, dt, dev);
    };
    Tensor t = make(n, in_dtype);
    t.fill_(1.0);
    Tensor out = all_reduce            ? Tensor()
                 : op == "all_to_all" ? make(n, in_dtype)
                                      : make(n / world, op == "reduce_scatter_widen" ? DType::f32 : in_dtype);
    auto issue_one = [&]() -> std::shared_ptr<distributed::Work> {
      if (all_reduce) return ctx.group->all_reduce(t, distributed::ReduceOp::Sum);
      if (op == "all_to_all") return ctx.group->all_to_all(out, t);
      if (op == "reduce_scatter") return ctx.group->reduce_scatter(out, t, distributed::ReduceOp::Sum);
      return ctx.group->reduce_scatter_widen(out, t, distributed::ReduceOp::Sum);
    };
    std::vector<double> ms, issue_us;
    for (int it = 0; it < iters + 5; ++it) {
      double elapsed;
      if (dev.is_cuda()) {
        cuda::Event e0, e1;
        auto stream = cuda::current_stream(dev.index);
        e0.record(stream);
        const auto h0 = std::chrono::steady_clock::now();
        std::shared_ptr<distributed::Work> work = issue_one();
        if (it >= 5)
          issue_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
        work->block_stream(stream);
        e1.record(stream);
        e1.synchronize();
        elapsed = e0.elapsed_ms(e1);
      } else {
        auto t0 = std::chrono::steady_clock::now();
        issue_one()->wait();
        elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      if (it >= 5) ms.push_back(elapsed);
    }
    std::sort(ms.begin(), ms.end());
    std::sort(issue_us.begin(), issue_us.end());
    const double issue = issue_us.empty() ? 0.0 : issue_us[issue_us.size() / 2];
    const double med = ms[ms.size() / 2], bytes = static_cast<double>(t.nbytes());
    const double bus = all_reduce ? 2.0 * (world - 1) / world : static_cast<double>(world - 1) / world;
    const double algbw = bytes / (med / 1e3) / 1e9;
    double b2b = 0;  // back to back: --iters collectives issued in a row, one pair of events around them
    if (dev.is_cuda()) {
      cuda::Event e0, e1;
      auto stream = cuda::current_stream(dev.index);
      e0.record(stream);
      std::shared_ptr<distributed::Work> last;
      for (int it = 0; it < iters; ++it) last = issue_one();
      last->block_stream(stream);
      e1.record(stream);
      e1.synchronize();
      b2b = e0.elapsed_ms(e1) / iters;
    } else {
      auto t0 = std::chrono::steady_clock::now();
      std::shared_ptr<distributed::Work> last;
      for (int it = 0; it < iters; ++it) last = issue_one();
      last->wait();
      b2b = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    }
    const double b2b_algbw = bytes / (b2b / 1e3) / 1e9;
    std::string product;
    if (beside > 0 && dev.is_cuda()) {
      // The product alone, then with the collective issued back to back on the comm stream beside it (enough of
      // them to outlast the products): medians of 5 rounds of 10 products each.
      NoGradGuard no_grad;
      const Tensor a = randn({beside, beside}, DType::bf16, dev), b = randn({beside, beside}, DType::bf16, dev);
      auto stream = cuda::current_stream(dev.index);
      auto products = [&](cuda::Event& e0, cuda::Event& e1) {
        e0.record(stream);
        for (int k = 0; k < 10; ++k) (void)matmul(a, b);
        e1.record(stream);
      };
      std::vector<double> alone, with;
      for (int round = 0; round < 6; ++round) {
        cuda::Event a0, a1, w0, w1;
        products(a0, a1);
        a1.synchronize();
        if (round > 0) alone.push_back(a0.elapsed_ms(a1) / 10);
        std::shared_ptr<distributed::Work> last;
        for (int it = 0; it < iters; ++it) last = issue_one();
        products(w0, w1);
        last->block_stream(stream);
        w1.synchronize();
        cuda::synchronize_device(dev.index);
        if (round > 0) with.push_back(w0.elapsed_ms(w1) / 10);
      }
      std::sort(alone.begin(), alone.end());
      std::sort(with.begin(), with.end());
      const double al = alone[alone.size() / 2], wi = with[with.size() / 2];
      char buf[96];
      std::snprintf(buf, sizeof buf, " %.3f | %.3f | %+.1f%% |", al, wi, (wi / al - 1) * 100);
      product = buf;
    }
    if (ctx.info.rank == 0)
      std::printf("| %s | %s | %.0f | %d | %s | %.3f | %.1f | %.1f | %.3f | %.1f | %.1f |%s\n", op.c_str(),
                  dtype.c_str(), bytes, world, dev.str().c_str(), med, algbw, algbw * bus, b2b, b2b_algbw * bus, issue,
                  product.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
  return 1;
}
