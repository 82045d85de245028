// Gradients made in their data-parallel bucket (compile/passes/bucket_views.h): a compiled DDP step in a world of
// one (Gloo, in this process) trains as the eager step does, its graph views the bucket instead of concatenating
// it, and the weight gradients' products write straight into the bucket's buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/exec/executor.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using ingot::testing::leaf;

// Records, for every weight-gradient product a compiled step runs, whether it wrote into a larger buffer.
class ProductWatch final : public OpProfilerHook {
 public:
  void begin_op(const Primitive&) override {}
  void end_op(const Primitive& p, const std::vector<Tensor>&, const std::vector<Tensor>& outs) override {
    if (p.name() == "all_reduce_start" && !outs.empty()) reduced.push_back(outs[0].data_ptr());
    if (p.name() != "matmul" || outs.empty() || (outs[0].shape() != Shape{16, 8} && outs[0].shape() != Shape{4, 16}))
      return;
    ++products;
    in_bucket += static_cast<int64_t>(outs[0].storage()->nbytes) > static_cast<int64_t>(outs[0].nbytes());
  }
  int products = 0, in_bucket = 0;
  std::vector<const void*> reduced;  // the buffers the all-reduces ran in
};

struct TrainRun {
  std::vector<double> losses;
  std::vector<Tensor> params;
  std::string graph;
  ProductWatch watch;
};

// Two linears (weights [16, 8] and [4, 16], a bias) under DDP with one bucket, AdamW, 4 steps.
void train(const std::shared_ptr<ProcessGroup>& group, bool compiled, TrainRun& out) {
  manual_seed(3);
  std::vector<Tensor> ps = {leaf(randn({16, 8})), leaf(randn({16})), leaf(randn({4, 16}))};
  DistributedDataParallel ddp(ps, group, DdpOptions{});
  optim::AdamW opt(ddp.optimizer_params(), optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  const Tensor x = randn({6, 8});
  auto step = [&](const std::vector<Tensor>& b) {
    Tensor y = linear(relu(linear(b[0], ps[0], ps[1])), ps[2]);
    Tensor loss = mean(mul(y, y));
    loss.backward();
    ddp.step(opt);
    ddp.zero_grad();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction fn = compile(step, CompileOptions{});
  for (int i = 0; i < 4; ++i) {
    // From the second call on the compiled step runs its executable (the first traces it eagerly).
    if (compiled && i == 1) set_op_profiler_hook(&out.watch);
    out.losses.push_back((compiled ? fn({x}) : step({x}))[0].item());
  }
  set_op_profiler_hook(nullptr);
  for (const Tensor& p : ps) out.params.push_back(p.clone_raw());
  if (compiled) out.graph = fn.stats().last_graph;
}

// A Gloo group of one in this process (its store served by `server`).
std::shared_ptr<ProcessGroup> group_of_one(const TcpStoreServer& server) {
  ProcessGroupOptions o;
  o.hostname = "127.0.0.1";
  return new_gloo_group(std::make_shared<TcpStore>("127.0.0.1", server.port()), 0, 1, o);
}

TEST(BucketViews, WeightGradientsAreWrittenIntoTheirBucketAndTrainingFollowsEager) {
  TcpStoreServer server(0, "127.0.0.1");
  const std::shared_ptr<ProcessGroup> group = group_of_one(server);
  TrainRun eager, comp;
  train(group, false, eager);
  train(group, true, comp);
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-5 * std::abs(eager.losses[i])) << "step " << i;
  for (size_t k = 0; k < eager.params.size(); ++k)
    EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 1e-4, 1e-6), 1.0) << "parameter " << k;
  // The bucket is a view of the pieces its producers wrote, not a concatenation.
  EXPECT_NE(comp.graph.find("bucket_view("), std::string::npos) << comp.graph;
  EXPECT_EQ(comp.graph.find(" cat("), std::string::npos) << comp.graph;
  // Three compiled steps, two weight-gradient products each, every one written into the bucket's buffer.
  EXPECT_EQ(comp.watch.products, 6);
  EXPECT_EQ(comp.watch.in_bucket, comp.watch.products);
}

// Note [Buckets from an allocator] (compile/exec/executor.h): with an allocator installed, the compiled step takes
// each bucket's buffer from it (here the same buffer every step, as NCCL symmetric windows would be), the products
// write into it and training is the same as with the buffers the executor allocates itself.
TEST(BucketViews, ABucketAllocatorGivesTheBucketsBufferAndTrainingIsUnchanged) {
  TcpStoreServer server(0, "127.0.0.1");
  const std::shared_ptr<ProcessGroup> group = group_of_one(server);
  TrainRun own, given;
  train(group, true, own);
  int calls = 0;
  std::map<std::pair<const void*, int32_t>, Tensor> slots;
  std::set<const void*> buffers;
  compiler::set_bucket_allocator([&](const compiler::Graph* g, int32_t v, const Shape& shape, DType dtype, Device dev) {
    ++calls;
    Tensor& slot = slots[{g, v}];
    if (!slot.defined()) slot = empty(shape, dtype, dev);
    buffers.insert(slot.data_ptr());
    return from_blob(std::make_shared<Tensor>(slot), slot.data_ptr(), shape, dtype, dev);
  });
  train(group, true, given);
  compiler::set_bucket_allocator(nullptr);
  EXPECT_EQ(calls, 3) << "one bucket per compiled step (three of them)";
  EXPECT_EQ(buffers.size(), 1u) << "the same buffer every step";
  EXPECT_EQ(given.watch.in_bucket, given.watch.products);
  EXPECT_EQ(given.losses, own.losses);
  // The all-reduce runs in the bucket's buffer itself (Note [In-place bucket reductions]), the allocator's.
  ASSERT_EQ(given.watch.reduced.size(), 3u);
  for (const void* p : given.watch.reduced) EXPECT_TRUE(buffers.count(p)) << "an all-reduce ran in a copy of its bucket";
  for (size_t k = 0; k < own.params.size(); ++k) EXPECT_EQ(max_rel_error(given.params[k], own.params[k], 0, 0), 0.0);
}

}  // namespace
}  // namespace ingot::distributed
