// TrainStep (recipes/train_step.h) on a tiny model, away from the training loop: gradient accumulation over
// micro-batches equals one step over the whole batch, the clip and the f16 loss scale reach the update as they
// should, and the compiled step computes what the eager one does.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <vector>

#include "autograd/nn/layers.h"
#include "autograd/ops.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "recipes/train_step.h"
#include "runtime/rng.h"

namespace ingot::recipes {
namespace {

constexpr int64_t kVocab = 11, kDim = 8, kRows = 4, kSeq = 6;

// Embedding -> linear head -> mean cross-entropy: the smallest model whose step has every piece of a language
// model's (an index gather, a product, a fused loss).
class TinyLM : public nn::Module {
 public:
  TinyLM() {
    emb_ = register_module("emb", std::make_shared<nn::Embedding>(kVocab, kDim, 0.5));
    head_ = register_module("head", std::make_shared<nn::Linear>(kDim, kVocab));
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) {
    Tensor logits = head_->forward(emb_->forward(ids));
    return cross_entropy(reshape(logits, {-1, kVocab}), reshape(targets, {-1}));
  }

 private:
  std::shared_ptr<nn::Embedding> emb_;
  std::shared_ptr<nn::Linear> head_;
};

// A model, its optimizer and a TrainStep over them, built alike from the same seed.
struct Stepper {
  std::unique_ptr<TinyLM> model;
  TrainOptions opts;
  TrainTask task;
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LossScaler> scaler;
  std::unique_ptr<TrainStep> step;
  std::ostringstream log;

  Stepper(int64_t grad_accum, double grad_clip, const optim::OptimizerSpec& spec, bool compiled = false,
          double loss_scale = 0, bool in_backward = false) {
    manual_seed(7);  // every Stepper starts from the same weights
    model = std::make_unique<TinyLM>();
    opts.grad_accum = grad_accum;
    opts.grad_clip = grad_clip;
    opts.optimizer_in_backward = in_backward;
    task.model = model.get();
    task.loss = [this](const MicroBatch& b) { return model->loss(b.inputs, b.targets); };
    params = model->parameters();
    opt = optim::make_optimizer(params, spec);
    if (loss_scale > 0) scaler = std::make_unique<optim::LossScaler>(optim::LossScalerOptions{.init_scale = loss_scale});
    CompileSettings c;
    c.enabled = compiled;
    step = std::make_unique<TrainStep>(TrainStepParts{.opts = opts,
                                                      .task = task,
                                                      .dp = nullptr,
                                                      .opt = *opt,
                                                      .masters = nullptr,
                                                      .scaler = scaler.get(),
                                                      .opt_params = params},
                                       c, log);
  }
  std::vector<std::vector<double>> weights() const {
    std::vector<std::vector<double>> w;
    for (const Tensor& p : params) w.push_back(p.to_vector());
    return w;
  }
};

optim::OptimizerSpec sgd(double lr) {
  optim::OptimizerSpec s;
  s.name = "sgd";
  s.lr = lr;
  return s;
}

// SGD with momentum and decay: an update proportional to the clipped gradient (AdamW's would hardly see the
// clip, being invariant to the gradient's scale).
optim::OptimizerSpec momentum_sgd() {
  optim::OptimizerSpec s = sgd(0.5);
  s.momentum = 0.9;
  s.weight_decay = 0.1;
  return s;
}

// Rows [first, first + n) of a batch, as one micro-batch's (inputs, targets).
std::vector<Tensor> rows(const Tensor& ids, const Tensor& targets, int64_t first, int64_t n) {
  return {contiguous(narrow(ids, 0, first, n)), contiguous(narrow(targets, 0, first, n))};
}

std::vector<Tensor> joined(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

double max_abs_diff(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < a[i].size(); ++k) d = std::max(d, std::abs(a[i][k] - b[i][k]));
  return d;
}

// The gradient of the whole batch's mean loss, computed directly on a model built like the Steppers'.
std::vector<std::vector<double>> reference_gradient(const Tensor& ids, const Tensor& targets) {
  manual_seed(7);
  TinyLM m;
  m.loss(ids, targets).backward();
  std::vector<std::vector<double>> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad().to_vector());
  return g;
}

double norm(const std::vector<std::vector<double>>& g) {
  double s = 0;
  for (const auto& t : g)
    for (double x : t) s += x * x;
  return std::sqrt(s);
}

class TrainStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(11);
    ids_ = randint(0, kVocab, {kRows, kSeq});
    targets_ = randint(0, kVocab, {kRows, kSeq});
  }
  Tensor ids_, targets_;
};

// Two micro-batches of 2 rows with equal token counts: the mean of their means is the 4-row mean, so the
// accumulated step (each loss times 1 / grad_accum) makes the same SGD update as one step over all 4 rows.
// Tolerance 1e-6: the same f32 sums in another order (an update of lr 0.5 times gradients of order 0.1).
TEST_F(TrainStepTest, AccumulatedMicroBatchesEqualTheWholeBatch) {
  Stepper whole(1, 0, sgd(0.5)), accumulated(2, 0, sgd(0.5));
  const TrainStep::Result a = whole.step->run(rows(ids_, targets_, 0, kRows));
  const TrainStep::Result b =
      accumulated.step->run(joined(rows(ids_, targets_, 0, 2), rows(ids_, targets_, 2, kRows - 2)));
  EXPECT_NEAR(a.loss.item(), b.loss.item(), 1e-6);
  EXPECT_NEAR(a.grad_norm(), b.grad_norm(), 1e-6);
  EXPECT_LT(max_abs_diff(whole.weights(), accumulated.weights()), 1e-6);
  // The step changed the weights, so equal weights are not two steps that did nothing.
  Stepper untouched(1, 0, sgd(0.5));
  EXPECT_GT(max_abs_diff(whole.weights(), untouched.weights()), 1e-3);
}

// grad_clip below the gradient's norm: the reported norm is the unclipped one, and the SGD update (lr 1) is
// the gradient scaled to norm grad_clip exactly. Tolerance 1e-6 relative to the norms (f32 sums).
TEST_F(TrainStepTest, ClippingScalesTheUpdateToGradClip) {
  const std::vector<std::vector<double>> g = reference_gradient(ids_, targets_);
  const double g_norm = norm(g), clip = g_norm / 4;
  Stepper s(1, clip, sgd(1.0));
  const std::vector<std::vector<double>> before = s.weights();
  const TrainStep::Result out = s.step->run(rows(ids_, targets_, 0, kRows));
  EXPECT_NEAR(out.grad_norm(), g_norm, 1e-6 * g_norm);
  const std::vector<std::vector<double>> after = s.weights();
  std::vector<std::vector<double>> update = before;
  for (size_t i = 0; i < update.size(); ++i)
    for (size_t k = 0; k < update[i].size(); ++k) update[i][k] -= after[i][k];
  EXPECT_NEAR(norm(update), clip, 1e-6 * g_norm);
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t k = 0; k < g[i].size(); ++k) ASSERT_NEAR(update[i][k], g[i][k] / 4, 1e-6) << "parameter " << i;
}

// f16 loss scaling: backward runs on the loss times the scale, and the update divides it out again, so a step
// under a scale of 1024 updates the weights as an unscaled step does and reports the unscaled norm (within
// 1e-6: powers of two scale f32 exactly, only the norm's rounding differs). A scale that makes the gradients
// overflow skips the update and halves the scale.
TEST_F(TrainStepTest, TheLossScaleIsDividedOutOfTheUpdateAndAnOverflowSkipsIt) {
  Stepper plain(1, 0, sgd(0.5)), scaled(1, 0, sgd(0.5), false, 1024);
  const TrainStep::Result a = plain.step->run(rows(ids_, targets_, 0, kRows));
  const TrainStep::Result b = scaled.step->run(rows(ids_, targets_, 0, kRows));
  EXPECT_EQ(b.loss_scale, 1024);
  EXPECT_FALSE(b.skipped);
  EXPECT_NEAR(a.loss.item(), b.loss.item(), 1e-6);  // the loss itself is reported unscaled
  EXPECT_NEAR(a.grad_norm(), b.grad_norm(), 1e-6);
  EXPECT_LT(max_abs_diff(plain.weights(), scaled.weights()), 1e-6);

  Stepper overflowing(1, 0, sgd(0.5), false, 1e39);
  const std::vector<std::vector<double>> before = overflowing.weights();
  const TrainStep::Result c = overflowing.step->run(rows(ids_, targets_, 0, kRows));
  EXPECT_TRUE(c.skipped);
  EXPECT_EQ(c.loss_scale, 1e39);  // beyond f32: the scaled loss is inf
  EXPECT_EQ(overflowing.scaler->scale(), 5e38);
  EXPECT_EQ(max_abs_diff(before, overflowing.weights()), 0);
}

// The compiled step (the whole step traced into one graph, the clip on the device) against the eager one over
// three momentum-SGD steps with accumulation and a clip that applies (checked): same losses, norms and weights
// within 1e-5 (generated kernels sum in another order than the eager ones).
TEST_F(TrainStepTest, TheCompiledStepComputesWhatTheEagerStepDoes) {
  constexpr double kClip = 0.05;
  Stepper eager(2, kClip, momentum_sgd()), compiled(2, kClip, momentum_sgd(), true);
  EXPECT_EQ(eager.step->compiled(), nullptr);
  for (int s = 0; s < 3; ++s) {
    manual_seed(100 + s);
    const Tensor ids = randint(0, kVocab, {kRows, kSeq}), targets = randint(0, kVocab, {kRows, kSeq});
    const std::vector<Tensor> batch = joined(rows(ids, targets, 0, 2), rows(ids, targets, 2, kRows - 2));
    const TrainStep::Result a = eager.step->run(batch);
    const TrainStep::Result b = compiled.step->run(batch);
    EXPECT_NEAR(a.loss.item(), b.loss.item(), 1e-5) << "step " << s + 1;
    EXPECT_GT(a.grad_norm(), 2 * kClip) << "step " << s + 1 << ": the clip should apply";
    EXPECT_NEAR(a.grad_norm(), b.grad_norm(), 1e-5) << "step " << s + 1;
    EXPECT_LT(max_abs_diff(eager.weights(), compiled.weights()), 1e-5) << "step " << s + 1;
  }
  ASSERT_NE(compiled.step->compiled(), nullptr);
  EXPECT_EQ(compiled.step->compiled()->stats().compiles, 1);  // one graph, traced once
}

// train.optimizer_in_backward in one process (Note [Each parameter updated in its backward], recipes/train_step.cpp):
// each parameter's AdamW update runs in the backward, the moment the engine has its whole gradient (the head's
// first, then the embedding's), eagerly and in the compiled step; the weights are those of the update after the
// backward, bit for bit, over three steps; no gradient is left behind and no norm is claimed. Once the TrainStep
// is gone its hooks do nothing: a plain backward then keeps its gradients and changes no weight.
TEST_F(TrainStepTest, UpdatesInTheBackwardEqualTheUpdateAfterItAndEndWithTheStep) {
  optim::OptimizerSpec adamw;
  adamw.lr = 0.05;
  adamw.weight_decay = 0.1;
  for (const bool compiled : {false, true}) {
    Stepper after(1, 0, adamw, compiled), in(1, 0, adamw, compiled, 0, true);
    EXPECT_NE(in.log.str().find("optimizer | updated in the backward: each parameter as soon as its gradient is "
                                "complete"),
              std::string::npos)
        << in.log.str();
    for (int s = 0; s < 3; ++s) {
      manual_seed(100 + s);
      const Tensor ids = randint(0, kVocab, {kRows, kSeq}), targets = randint(0, kVocab, {kRows, kSeq});
      const TrainStep::Result a = after.step->run({ids, targets});
      const TrainStep::Result b = in.step->run({ids, targets});
      EXPECT_EQ(a.loss.item(), b.loss.item()) << "compiled " << compiled << ", step " << s + 1;
      EXPECT_EQ(max_abs_diff(after.weights(), in.weights()), 0) << "compiled " << compiled << ", step " << s + 1;
      EXPECT_GT(max_abs_diff(after.weights(), Stepper(1, 0, adamw).weights()), 0);  // the weights did move
      EXPECT_LT(b.grad_norm(), 0);  // not measured: each gradient was dropped after its update
      for (const Tensor& p : in.params) EXPECT_FALSE(p.grad().defined());
    }
    if (compiled) EXPECT_EQ(in.step->compiled()->stats().compiles, 1);
    in.step.reset();
    const std::vector<std::vector<double>> kept = in.weights();
    in.model->loss(ids_, targets_).backward();
    EXPECT_EQ(max_abs_diff(kept, in.weights()), 0) << "compiled " << compiled;
    for (const Tensor& p : in.params) EXPECT_TRUE(p.grad().defined()) << "compiled " << compiled;
  }
}

}  // namespace
}  // namespace ingot::recipes
