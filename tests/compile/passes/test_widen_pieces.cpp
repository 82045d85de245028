// Reduced gradients widened piece by piece (compile/passes/widen_pieces.h): a compiled DDP step over bf16 weights
// reduced in f32 (Gloo, a world of one, in this process) trains as the eager step does, and its graph casts each
// gradient where it is made (the products' outputs, not their reshapes), the f32 bucket is a view of the casts'
// outputs and the all-reduce reads that view: no bf16 bucket is concatenated and then cast whole.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "autograd/ops.h"
#include "compile/api.h"
#include "compile/passes/passes.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot::distributed {
namespace {

using ingot::testing::leaf;

struct TrainRun {
  std::vector<double> losses;
  std::vector<Tensor> params;
  std::string graph;
};

// Two linears in bf16 (weights [16, 8] and [4, 16], a bias) under DDP with one bucket reduced in f32, AdamW over
// f32 masters.
void train(const std::shared_ptr<ProcessGroup>& group, bool compiled, TrainRun& out) {
  manual_seed(3);
  std::vector<Tensor> ps = {leaf(randn({16, 8}).to(DType::bf16)), leaf(randn({16}).to(DType::bf16)),
                            leaf(randn({4, 16}).to(DType::bf16))};
  DdpOptions o;
  o.reduce_dtype = DType::f32;
  DistributedDataParallel ddp(ps, group, o);
  optim::MasterWeights masters(ddp.optimizer_params());  // f32 masters, as a bf16 run keeps them
  optim::AdamW opt(masters.master(), optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  const Tensor x = randn({6, 8}).to(DType::bf16);
  auto step = [&](const std::vector<Tensor>& b) {
    Tensor y = linear(relu(linear(b[0], ps[0], ps[1])), ps[2]);
    Tensor loss = mean(mul(cast(y, DType::f32), cast(y, DType::f32)));
    loss.backward();
    ddp.synchronize();
    masters.copy_grads_to_master();
    opt.step();
    masters.copy_to_model();
    opt.zero_grad();
    ddp.zero_grad();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction fn = compile(step, CompileOptions{});
  for (int i = 0; i < 4; ++i) out.losses.push_back((compiled ? fn({x}) : step({x}))[0].item());
  for (const Tensor& p : ps) out.params.push_back(p.to(DType::f32));
  if (compiled) out.graph = fn.stats().last_graph;
}

// The printed graph's producers: value id -> (op, input ids).
struct Producer {
  std::string op;
  std::vector<int> ins;
};
std::map<int, Producer> producers(const std::string& graph) {
  std::map<int, Producer> out;
  const std::regex line(R"(%(\d+)[^=]*= ([a-z_0-9:+]+)\(([^)]*)\))");
  const std::regex id(R"(%(\d+))");
  std::istringstream in(graph);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    Producer p{m[2].str(), {}};
    const std::string args = m[3].str();
    for (auto it = std::sregex_iterator(args.begin(), args.end(), id); it != std::sregex_iterator(); ++it)
      p.ins.push_back(std::stoi((*it)[1].str()));
    out[std::stoi(m[1].str())] = p;
  }
  return out;
}

TEST(WidenPieces, Bf16GradientsReducedInF32AreCastWhereTheyAreMadeAndTrainingFollowsEager) {
  TcpStoreServer server(0, "127.0.0.1");
  ProcessGroupOptions o;
  o.hostname = "127.0.0.1";
  const std::shared_ptr<ProcessGroup> group =
      new_gloo_group(std::make_shared<TcpStore>("127.0.0.1", server.port()), 0, 1, o);
  TrainRun eager, comp;
  train(group, false, eager);
  train(group, true, comp);
  // A cast of a concatenation equals the concatenation of its pieces' casts element for element; the rest of
  // the step may differ by the bf16 rounding of fused kernels.
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
  for (size_t k = 0; k < eager.params.size(); ++k)
    EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 2e-2, 1e-2), 1.0) << "parameter " << k;
  const std::map<int, Producer> prod = producers(comp.graph);
  int starts = 0;
  for (const auto& [v, p] : prod) {
    if (p.op != "all_reduce_start") continue;
    ++starts;
    ASSERT_EQ(p.ins.size(), 1u) << comp.graph;
    const auto in = prod.find(p.ins[0]);
    ASSERT_NE(in, prod.end()) << comp.graph;
    EXPECT_EQ(in->second.op, "bucket_view") << "the all-reduce reads " << in->second.op << ":\n" << comp.graph;
  }
  EXPECT_EQ(starts, 1) << comp.graph;
  // Both weight gradients' products are cast as they are made: a cast reads each product itself.
  int products_cast = 0;
  for (const auto& [v, p] : prod) {
    if (p.op.find("cast") == std::string::npos || p.ins.size() != 1) continue;
    const auto in = prod.find(p.ins[0]);
    products_cast += in != prod.end() && in->second.op == "matmul";
  }
  EXPECT_EQ(products_cast, 2) << comp.graph;
}

}  // namespace
}  // namespace ingot::distributed
