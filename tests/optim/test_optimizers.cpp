#include <cmath>
#include <filesystem>
#include <memory>

#include "optim/optimizer.h"
#include "runtime/safetensors.h"
#include "testing.h"

namespace ingot {
namespace {

Tensor param(const std::vector<double>& v) { return testing::leaf(from_vector(v, {static_cast<int64_t>(v.size())})); }
void set_grad(Tensor& p, const std::vector<double>& g) {
  p.set_grad(from_vector(g, {static_cast<int64_t>(g.size())}));
}

// The kernels compute in f32: relative 2e-6 plus an absolute 1e-7 for values that come out of cancellations.
void expect_values(const Tensor& t, const std::vector<double>& ref) {
  std::vector<double> v = t.to_vector();
  ASSERT_EQ(v.size(), ref.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], ref[i], 1e-7 + 2e-6 * std::abs(ref[i])) << "element " << i;
}

// torch.optim.AdamW for one tensor, in double.
struct AdamWRef {
  AdamWRef(optim::AdamWOptions opts, std::vector<double> init) : o(opts), p(std::move(init)) {}
  optim::AdamWOptions o;
  std::vector<double> p, m, v;
  int64_t t = 0;
  void step(const std::vector<double>& g, double scale = 1.0) {
    ++t;
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i] * scale;
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
      double mh = m[i] / (1 - std::pow(o.beta1, t)), vh = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
};

// torch.optim.SGD for one tensor, in double.
struct SGDRef {
  SGDRef(optim::SGDOptions opts, std::vector<double> init) : o(opts), p(std::move(init)) {}
  optim::SGDOptions o;
  std::vector<double> p, buf;
  void step(const std::vector<double>& g) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        if (buf.size() < p.size()) buf.push_back(d);
        else buf[i] = o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
};

TEST(AdamW, FirstStepMovesEachWeightByLrTimesSignOfGrad) {
  // Hand-computed: p = 1 - lr*wd*1 = 0.999; m_hat = g, v_hat = g^2, so the update is lr * g / |g| = 0.1.
  Tensor p = param({1.0, -2.0});
  set_grad(p, {0.5, -3.0});
  optim::AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.01});
  opt.step();
  expect_values(p, {0.999 - 0.1, -2.0 * 0.999 + 0.1});
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(AdamW, ThreeStepsMatchTorchSemantics) {
  optim::AdamWOptions o{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  AdamWRef ref{o, {0.3, -1.2, 2.0, 0.0}};
  Tensor p = param(ref.p);
  optim::AdamW opt({p}, o);
  const std::vector<std::vector<double>> grads = {{0.1, -0.2, 0.3, 1.0}, {-0.4, 0.0, 0.25, 0.5}, {0.2, 0.3, -1.0, 0.0}};
  for (const auto& g : grads) {
    set_grad(p, g);
    opt.step();
    ref.step(g);
  }
  expect_values(p, ref.p);
  expect_values(opt.state_dict().at("0.exp_avg"), ref.m);
  expect_values(opt.state_dict().at("0.exp_avg_sq"), ref.v);
}

TEST(AdamW, SkipsParametersWithoutGradAndCorrectsBiasPerParameter) {
  optim::AdamWOptions o{.lr = 0.01};
  AdamWRef ra{o, {1.0, 2.0}}, rb{o, {-1.0}};
  Tensor a = param(ra.p), b = param(rb.p);
  optim::AdamW opt({a, b}, o);
  set_grad(a, {0.5, -0.5});
  opt.step();
  ra.step({0.5, -0.5});
  expect_values(b, {-1.0});  // untouched, and no state created
  EXPECT_EQ(opt.state_dict().count("1.exp_avg"), 0u);
  set_grad(b, {2.0});
  opt.step();  // a's grad from the first step is still there
  ra.step({0.5, -0.5});
  rb.step({2.0});  // b's first step: bias correction with t = 1
  expect_values(a, ra.p);
  expect_values(b, rb.p);
}

TEST(AdamW, GradScaleAppliesToTheNextStepOnly) {
  optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.0};
  AdamWRef ref{o, {1.0, 2.0, 3.0}};
  Tensor p = param(ref.p);
  optim::AdamW opt({p}, o);
  set_grad(p, {0.3, -0.1, 0.2});
  opt.set_grad_scale(0.25);
  opt.step();
  ref.step({0.3, -0.1, 0.2}, 0.25);
  opt.step();
  ref.step({0.3, -0.1, 0.2}, 1.0);
  expect_values(p, ref.p);
  expect_values(p.grad(), {0.3, -0.1, 0.2});  // the .grad itself is not scaled
}

TEST(AdamW, RejectsF16Parameters) {
  Tensor p = testing::leaf(ones({2}, DType::f16));
  EXPECT_THROW(optim::AdamW({p}), Error);
}

// train.master_weights: false. bf16 weights updated by AdamW directly move as f32 ones do on average, though each
// step moves a weight by ~0.07 of its bf16 ulp (lr 1e-5 on weights of magnitude ~0.02): rounded to nearest, none
// would move at all (Note [Stochastic rounding], runtime/kernels/scalar_math.h). The measure: the regression slope of
// the bf16 displacements on the f32 ones over 8192 weights, 1 within the rounding noise (~0.01 here).
TEST(AdamW, Bf16WeightsRoundedStochasticallyMoveAsF32OnesOnAverage) {
  manual_seed(17);
  const int64_t n = 8192;
  const Tensor start = mul(randn({n}), 0.02).to(DType::bf16);
  for (bool eight_bit : {false, true}) {
    Tensor p16 = testing::leaf(start.clone_raw()), p32 = testing::leaf(start.to(DType::f32));
    const optim::AdamWOptions o{.lr = 1e-5, .weight_decay = 0.0};
    std::unique_ptr<optim::Optimizer> a = eight_bit ? std::unique_ptr<optim::Optimizer>(new optim::AdamW8bit({p16}, o))
                                                    : std::unique_ptr<optim::Optimizer>(new optim::AdamW({p16}, o));
    std::unique_ptr<optim::Optimizer> b = eight_bit ? std::unique_ptr<optim::Optimizer>(new optim::AdamW8bit({p32}, o))
                                                    : std::unique_ptr<optim::Optimizer>(new optim::AdamW({p32}, o));
    const Tensor dir = randn({n});  // a steady gradient direction with noise per step
    for (int step = 0; step < 20; ++step) {
      const Tensor g = add(dir, mul(randn({n}), 0.3));
      p16.set_grad(g.to(DType::bf16));
      p32.set_grad(g.to(DType::bf16).to(DType::f32));
      a->step();
      b->step();
    }
    ASSERT_EQ(p16.dtype(), DType::bf16);
    const std::vector<double> s0 = start.to(DType::f32).to_vector(), v16 = p16.to(DType::f32).to_vector(),
                              v32 = p32.to_vector();
    double dot = 0, sq = 0;
    int64_t moved = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d16 = v16[i] - s0[i], d32 = v32[i] - s0[i];
      dot += d16 * d32;
      sq += d32 * d32;
      moved += d16 != 0;
    }
    EXPECT_NEAR(dot / sq, 1.0, 0.05) << (eight_bit ? "AdamW8bit" : "AdamW");
    EXPECT_GT(moved, n / 2) << (eight_bit ? "AdamW8bit" : "AdamW");
  }
}

TEST(AdamW, StateDictResumesExactlyThroughSafetensors) {
  manual_seed(3);
  Tensor init_a = randn({3, 2}), init_b = randn({4});
  auto grads_for = [](const Tensor& p, int step) {  // deterministic, parameter-dependent gradients
    NoGradGuard ng;
    return add(mul(p, 0.5), static_cast<double>(step) * 0.1).contiguous_raw();
  };
  auto run = [&](optim::AdamW& opt, std::vector<Tensor>& ps, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (Tensor& p : ps) p.set_grad(grads_for(p, s));
      opt.step();
    }
  };
  optim::AdamWOptions o{.lr = 0.02};
  std::vector<Tensor> ref = {testing::leaf(init_a.clone_raw()), testing::leaf(init_b.clone_raw())};
  optim::AdamW opt_ref(ref, o);
  run(opt_ref, ref, 0, 5);

  std::vector<Tensor> first = {testing::leaf(init_a.clone_raw()), testing::leaf(init_b.clone_raw())};
  optim::AdamW opt1(first, o);
  run(opt1, first, 0, 3);
  const std::string path = (std::filesystem::temp_directory_path() / "ingot_test_adamw_state.safetensors").string();
  auto sd = opt1.state_dict();
  save_safetensors(path, {sd.begin(), sd.end()});

  std::vector<Tensor> resumed = {testing::leaf(first[0].clone_raw()), testing::leaf(first[1].clone_raw())};
  optim::AdamW opt2(resumed, o);
  SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, Tensor> loaded;
  for (const auto& n : f.names()) loaded[n] = f.get(n);
  opt2.load_state_dict(loaded);
  EXPECT_EQ(opt2.step_count(), 3);
  run(opt2, resumed, 3, 5);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(ref[i].to_vector(), resumed[i].to_vector());
  std::filesystem::remove(path);

  loaded["7.exp_avg"] = zeros({4});
  EXPECT_THROW(opt2.load_state_dict(loaded), Error);
}

TEST(SGD, PlainStepIsLrTimesGrad) {
  Tensor p = param({1.0, -1.0});
  set_grad(p, {0.5, 2.0});
  optim::SGD opt({p}, {.lr = 0.1});
  opt.step();
  expect_values(p, {0.95, -1.2});
}

TEST(SGD, MomentumDampeningNesterovAndWeightDecayMatchTorch) {
  std::vector<optim::SGDOptions> cases = {
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01},
      {.lr = 0.05, .momentum = 0.7, .weight_decay = 0.1, .nesterov = true},
  };
  for (const auto& o : cases) {
    SCOPED_TRACE(::testing::Message() << "momentum " << o.momentum << " nesterov " << o.nesterov);
    SGDRef ref{o, {0.5, -0.25, 1.5}};
    Tensor p = param(ref.p);
    optim::SGD opt({p}, o);
    for (const auto& g : std::vector<std::vector<double>>{{0.1, 0.2, -0.3}, {-0.5, 0.1, 0.4}, {0.3, 0.3, 0.3}}) {
      set_grad(p, g);
      opt.step();
      ref.step(g);
    }
    expect_values(p, ref.p);
    expect_values(opt.state_dict().at("0.momentum_buffer"), ref.buf);
  }
  EXPECT_THROW(optim::SGD({param({1.0})}, {.nesterov = true}), Error);
}

// Lion (Chen et al. 2023, lucidrains/lion-pytorch) for one tensor, in double.
struct LionRef {
  LionRef(optim::LionOptions opts, std::vector<double> init) : o(opts), p(std::move(init)), m(p.size(), 0.0) {}
  optim::LionOptions o;
  std::vector<double> p, m;
  void step(const std::vector<double>& g, double scale = 1.0) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * scale, c = o.beta1 * m[i] + (1 - o.beta1) * gi;
      p[i] = p[i] * (1 - o.lr * o.weight_decay) - o.lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
      m[i] = o.beta2 * m[i] + (1 - o.beta2) * gi;
    }
  }
};

TEST(Lion, FirstStepMovesEachWeightByLrTimesSignOfGradAfterDecay) {
  // Hand-computed: m = 0, so c = (1 - beta1) g and the step is lr * sign(g); a zero gradient does not move;
  // p = p (1 - lr wd) first: 1 * (1 - 0.1 * 0.5) - 0.1 = 0.85, -2 * 0.95 + 0.1 = -1.8, 3 * 0.95 = 2.85.
  Tensor p = param({1.0, -2.0, 3.0});
  set_grad(p, {0.5, -3.0, 0.0});
  optim::Lion opt({p}, {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.5});
  opt.step();
  expect_values(p, {0.85, -1.8, 2.85});
  // m = (1 - beta2) g
  expect_values(opt.state_dict().at("0.exp_avg"), {0.005, -0.03, 0.0});
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(Lion, FourStepsMatchTheReferenceInDoubleIncludingAGradScale) {
  const optim::LionOptions o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .weight_decay = 0.1};
  LionRef ref{o, {0.3, -1.2, 2.0, 0.0}};
  Tensor p = param(ref.p);
  optim::Lion opt({p}, o);
  // Later gradients oppose the momentum, so the sign of the interpolation differs from the gradient's sign.
  const std::vector<std::vector<double>> grads = {
      {0.1, -0.2, 0.3, 1.0}, {-0.4, 0.0, 0.25, 0.5}, {-0.05, 0.3, -1.0, 0.0}, {0.01, -0.01, 0.02, -0.2}};
  for (size_t k = 0; k < grads.size(); ++k) {
    const double scale = k == 2 ? 0.5 : 1.0;
    set_grad(p, grads[k]);
    opt.set_grad_scale(scale);
    opt.step();
    ref.step(grads[k], scale);
  }
  expect_values(p, ref.p);
  expect_values(opt.state_dict().at("0.exp_avg"), ref.m);
  EXPECT_EQ(opt.step_count(), 4);
  EXPECT_TRUE(p.is_leaf());
}

TEST(Lion, SkipsParametersWithoutGradAndResumesFromItsStateDict) {
  Tensor a = param({1.0, 2.0}), b = param({3.0});
  optim::Lion opt({a, b}, {.lr = 0.1});
  set_grad(a, {1.0, -1.0});
  opt.step();
  expect_values(b, {3.0});
  EXPECT_EQ(opt.state_dict().count("1.exp_avg"), 0u);
  // A fresh optimizer loaded with the state continues exactly as the first one does.
  Tensor a2 = param(a.to_vector()), b2 = param({3.0});
  optim::Lion resumed({a2, b2}, {.lr = 0.1});
  resumed.load_state_dict(opt.state_dict());
  for (optim::Lion* o : {&opt, &resumed}) {
    Tensor& t = o == &opt ? a : a2;
    set_grad(t, {-0.02, -1.0});
    o->step();
  }
  expect_values(a2, a.to_vector());
  EXPECT_THROW(optim::Lion({testing::leaf(from_vector({1.0}, {1}).to(DType::bf16))}), Error);
}

TEST(Optimizer, MakeOptimizerBuildsTheNamedUpdateRule) {
  Tensor p = param({1.0});
  EXPECT_NE(dynamic_cast<optim::AdamW*>(optim::make_optimizer({p}, {.name = "adamw"}).get()), nullptr);
  auto sgd = optim::make_optimizer({p}, {.name = "sgd", .lr = 0.5, .momentum = 0.9, .nesterov = true});
  ASSERT_NE(dynamic_cast<optim::SGD*>(sgd.get()), nullptr);
  EXPECT_EQ(static_cast<optim::SGD*>(sgd.get())->options().momentum, 0.9);
  EXPECT_TRUE(static_cast<optim::SGD*>(sgd.get())->options().nesterov);
  auto lion = optim::make_optimizer({p}, {.name = "lion", .beta2 = 0.98});
  ASSERT_NE(dynamic_cast<optim::Lion*>(lion.get()), nullptr);
  EXPECT_EQ(static_cast<optim::Lion*>(lion.get())->options().beta2, 0.98);
  auto eight = optim::make_optimizer({p}, {.name = "adamw8bit", .beta2 = 0.95, .weight_decay = 0.1});
  ASSERT_NE(dynamic_cast<optim::AdamW8bit*>(eight.get()), nullptr);
  EXPECT_EQ(static_cast<optim::AdamW8bit*>(eight.get())->options().beta2, 0.95);
  EXPECT_EQ(static_cast<optim::AdamW8bit*>(eight.get())->options().weight_decay, 0.1);
  EXPECT_THROW(optim::make_optimizer({p}, {.name = "adam8bit"}), Error);
}

TEST(Optimizer, ZeroGradDropsGradients) {
  Tensor p = param({1.0});
  set_grad(p, {1.0});
  optim::SGD opt({p});
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
}

}  // namespace
}  // namespace ingot
