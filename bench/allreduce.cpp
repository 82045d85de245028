// All-reduce bandwidth of ingot's process group (NCCL on GPUs, Gloo on CPUs), like nccl-tests' all_reduce_perf:
//   ingot launch --nproc-per-node N -- bench_allreduce [--device cuda|cpu] [--min-mb 1] [--max-mb 1024] [--iters 20]
// For each size (doubling), f32 sum all-reduce; median over --iters after 5 warm-up runs, timed with CUDA events
// on the group's work (host clock on CPU). algbw = bytes / time; busbw = algbw * 2 (n - 1) / n, the figure that
// compares across world sizes. Each timed run includes issuing the collective from the host; the back-to-back
// columns time --iters collectives issued in a row and divide (nccl-tests' way: the issue overlaps the previous
// collective, so only the device's throughput is left). The issue column is the host's median time inside the
// all_reduce call (queueing it, not running it). Rank 0 prints the table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "distributed/bootstrap.h"
#include "runtime/cuda_runtime.h"
#include "runtime/tensor.h"

using namespace ingot;

int main(int argc, char** argv) try {
  std::string device = "cuda";
  double min_mb = 1, max_mb = 1024;
  int iters = 20;
  CLI::App app{"All-reduce bandwidth of ingot's process group (f32 sum, sizes doubling from --min-mb to --max-mb).",
               "bench_allreduce"};
  app.add_option("--device", device, "cuda (NCCL) or cpu (Gloo)")->capture_default_str();
  app.add_option("--min-mb", min_mb, "smallest size, MiB")->capture_default_str();
  app.add_option("--max-mb", max_mb, "largest size, MiB")->capture_default_str();
  app.add_option("--iters", iters, "timed runs per size (after 5 warm-up)")->capture_default_str();
  bench::parse_or_exit(app, argc, argv);
  distributed::InitOptions opts;
  opts.backend = device == "cpu" ? "gloo" : "nccl";
  distributed::DistributedContext ctx = distributed::init_distributed(opts);
  const int world = ctx.info.world_size;
  Device dev = parse_device(device);
  if (dev.is_cuda() && cuda_device_count() > 1) dev = Device::cuda(ctx.info.local_rank);
  if (ctx.info.rank == 0)
    std::printf("| bytes | ranks | device | median ms | algbw GB/s | busbw GB/s | back-to-back ms | back-to-back busbw "
                "GB/s | issue us |\n|---|---|---|---|---|---|---|---|---|\n");
  for (double mb = min_mb; mb <= max_mb; mb *= 2) {
    const int64_t n = static_cast<int64_t>(mb * (1 << 20) / 4);
    Tensor t = ones({n}, DType::f32, dev);
    std::vector<double> ms, issue_us;
    for (int it = 0; it < iters + 5; ++it) {
      double elapsed;
      if (dev.is_cuda()) {
        cuda::Event e0, e1;
        auto stream = cuda::current_stream(dev.index);
        e0.record(stream);
        const auto h0 = std::chrono::steady_clock::now();
        std::shared_ptr<distributed::Work> work = ctx.group->all_reduce(t, distributed::ReduceOp::Sum);
        if (it >= 5)
          issue_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
        work->block_stream(stream);
        e1.record(stream);
        e1.synchronize();
        elapsed = e0.elapsed_ms(e1);
      } else {
        auto t0 = std::chrono::steady_clock::now();
        ctx.group->all_reduce(t, distributed::ReduceOp::Sum)->wait();
        elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      if (it >= 5) ms.push_back(elapsed);
    }
    std::sort(ms.begin(), ms.end());
    std::sort(issue_us.begin(), issue_us.end());
    const double issue = issue_us.empty() ? 0.0 : issue_us[issue_us.size() / 2];
    const double med = ms[ms.size() / 2], bytes = static_cast<double>(n) * 4;
    const double algbw = bytes / (med / 1e3) / 1e9;
    double b2b = 0;  // back to back: --iters collectives issued in a row, one pair of events around them
    if (dev.is_cuda()) {
      cuda::Event e0, e1;
      auto stream = cuda::current_stream(dev.index);
      e0.record(stream);
      std::shared_ptr<distributed::Work> last;
      for (int it = 0; it < iters; ++it) last = ctx.group->all_reduce(t, distributed::ReduceOp::Sum);
      last->block_stream(stream);
      e1.record(stream);
      e1.synchronize();
      b2b = e0.elapsed_ms(e1) / iters;
    } else {
      auto t0 = std::chrono::steady_clock::now();
      std::shared_ptr<distributed::Work> last;
      for (int it = 0; it < iters; ++it) last = ctx.group->all_reduce(t, distributed::ReduceOp::Sum);
      last->wait();
      b2b = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    }
    const double b2b_algbw = bytes / (b2b / 1e3) / 1e9;
    if (ctx.info.rank == 0)
      std::printf("| %.0f | %d | %s | %.3f | %.1f | %.1f | %.3f | %.1f | %.1f |\n", bytes, world,
                  dev.str().c_str(), med, algbw, algbw * 2.0 * (world - 1) / world, b2b,
                  b2b_algbw * 2.0 * (world - 1) / world, issue);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_allreduce: error: %s\n", e.what());
  return 1;
}
