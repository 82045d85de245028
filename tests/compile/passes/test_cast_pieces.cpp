// Reduced gradients cast piece by piece (compile/passes/cast_pieces.h), on compiled DDP steps in a world of one
// (Gloo, in this process): bf16 weights reduced in f32 (each gradient widened where it is made) and f32 weights
// computed in bf16 reduced in bf16 (the products write the bf16 bucket, the autocast widening and the bucket's
// narrowing both gone). Each trains as its eager step does, and in each graph the all-reduce reads the bucket as a
// view of its pieces: no bucket is concatenated in one dtype and then cast whole.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "autograd/ops.h"
#include "compile/api.h"
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

// Two linears (weights [16, 8] and [4, 16], a bias) with weights in `weights`, computed in bf16 (an f32 weight is
// cast for its product, as autocast does), under DDP with one bucket reduced in `reduce`; AdamW over f32 masters
// of bf16 weights, over the weights themselves when f32.
void train(const std::shared_ptr<ProcessGroup>& group, DType weights, DType reduce, bool compiled, TrainRun& out) {
  manual_seed(3);
  std::vector<Tensor> ps = {leaf(randn({16, 8}).to(weights)), leaf(randn({16}).to(weights)),
                            leaf(randn({4, 16}).to(weights))};
  DdpOptions o;
  o.reduce_dtype = reduce;
  DistributedDataParallel ddp(ps, group, o);
  std::optional<optim::MasterWeights> masters;
  if (weights != DType::f32) masters.emplace(ddp.optimizer_params());
  optim::AdamW opt(masters ? masters->master() : ddp.optimizer_params(),
                   optim::AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  const Tensor x = randn({6, 8}).to(DType::bf16);
  auto bf = [](const Tensor& t) { return cast(t, DType::bf16); };  // the tensor itself when already bf16
  auto step = [&](const std::vector<Tensor>& b) {
    Tensor y = linear(relu(linear(b[0], bf(ps[0]), bf(ps[1]))), bf(ps[2]));
    Tensor loss = mean(mul(cast(y, DType::f32), cast(y, DType::f32)));
    loss.backward();
    ddp.synchronize();
    if (masters) masters->copy_grads_to_master();
    opt.step();
    if (masters) masters->copy_to_model();
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

struct GraphFacts {
  int starts = 0, starts_reading_a_view = 0;
  int products = 0, products_cast = 0;  // weight-gradient products ([16, 8] or [4, 16] results are not told
                                        // apart here: every matmul) and those a cast reads
};
GraphFacts facts(const std::string& graph) {
  const std::map<int, Producer> prod = producers(graph);
  GraphFacts f;
  for (const auto& [v, p] : prod) {
    if (p.op == "matmul") ++f.products;
    if (p.op == "all_reduce_start" && p.ins.size() == 1) {
      ++f.starts;
      const auto in = prod.find(p.ins[0]);
      f.starts_reading_a_view += in != prod.end() && in->second.op == "bucket_view";
    }
    if (p.op.find("cast") != std::string::npos && p.ins.size() == 1) {
      const auto in = prod.find(p.ins[0]);
      f.products_cast += in != prod.end() && in->second.op == "matmul";
    }
  }
  return f;
}

class CastPieces : public ::testing::Test {
 protected:
  void SetUp() override {
    ProcessGroupOptions o;
    o.hostname = "127.0.0.1";
    group_ = new_gloo_group(std::make_shared<TcpStore>("127.0.0.1", server_.port()), 0, 1, o);
  }
  // Trains eagerly and compiled; expects the compiled run to follow the eager one and its graph's all-reduce to
  // read the bucket as a view of its pieces; returns the compiled graph's facts.
  GraphFacts compiled_following_eager(DType weights, DType reduce) {
    TrainRun eager, comp;
    train(group_, weights, reduce, false, eager);
    train(group_, weights, reduce, true, comp);
    // Casting a concatenation equals concatenating the pieces' casts; the rest of the step may differ by the bf16
    // rounding of fused kernels (and, widened, by the gradients' own bf16 rounding).
    for (size_t i = 0; i < eager.losses.size(); ++i)
      EXPECT_NEAR(comp.losses[i], eager.losses[i], 1e-2 * std::abs(eager.losses[i])) << "step " << i;
    for (size_t k = 0; k < eager.params.size(); ++k)
      EXPECT_LE(max_rel_error(comp.params[k], eager.params[k], 2e-2, 1e-2), 1.0) << "parameter " << k;
    const GraphFacts f = facts(comp.graph);
    EXPECT_EQ(f.starts, 1) << comp.graph;
    EXPECT_EQ(f.starts_reading_a_view, f.starts) << comp.graph;
    graph_ = comp.graph;
    return f;
  }
  std::string graph_;
  TcpStoreServer server_{0, "127.0.0.1"};
  std::shared_ptr<ProcessGroup> group_;
};

TEST_F(CastPieces, Bf16GradientsReducedInF32AreWidenedWhereTheyAreMade) {
  const GraphFacts f = compiled_following_eager(DType::bf16, DType::f32);
  // Both weight gradients' products are cast as they are made (on a CUDA target they become widened products).
  EXPECT_EQ(f.products_cast, 2) << graph_;
}

TEST_F(CastPieces, AutocastGradientsReducedInBf16AreWrittenIntoTheBucketByTheirProducts) {
  const GraphFacts f = compiled_following_eager(DType::f32, DType::bf16);
  // No cast reads a product: autocast's widening of each weight gradient and the bucket's narrowing are gone.
  EXPECT_GE(f.products, 2) << graph_;
  EXPECT_EQ(f.products_cast, 0) << graph_;
}

}  // namespace
}  // namespace ingot::distributed
