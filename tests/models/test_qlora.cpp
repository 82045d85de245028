// QLoRA on the CPU (models/qlora.h, autograd/ops/nf4_linear.h): nf4_linear equals linear over the dequantized
// weight forward and backward without saving its input; the tiny Llama fixture with an NF4 base and LoRA adapters trains
// and follows LoRA over the dequantized weights step for step; the model holds no dense base values; the
// quantized bytes are reported; bad weights are errors naming the tensor and leave the model as it was.
#include "models/qlora.h"

#include <gtest/gtest.h>

#include "../testing.h"
#include "autograd/ops/nf4_linear.h"
#include "models/hf_checkpoint.h"
#include "optim/optimizer.h"
#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"
#include "tiny_models.h"
#include "tests/testing.h"

namespace ingot {
namespace {

using ingot::testing::error_of;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

TEST(Nf4Linear, ForwardAndInputGradientEqualLinearOverTheDequantizedWeight) {
  manual_seed(7);
  const Nf4Tensor q = nf4_quantize(randn({48, 64}, DType::f32, Device::cpu(), 0.0, 0.05), "proj.weight");
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = randn({2, 3, 64}).to(dt).set_requires_grad(true);
    Tensor x_ref = x.detach().clone_raw().set_requires_grad(true);
    Tensor y = nf4_linear(x, q);
    Tensor y_ref = linear(x_ref, nf4_dequantize(q, dt));
    ASSERT_EQ(y.shape(), (Shape{2, 3, 48}));
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.to_vector(), y_ref.to_vector()) << dtype_name(dt);  // the same kernel on the same operands
    Tensor g = randn({2, 3, 48}).to(dt);
    y.backward(g);
    y_ref.backward(g);
    EXPECT_LE(max_abs_diff(x.grad(), x_ref.grad()), dt == DType::f32 ? 1e-6 : 1e-2) << dtype_name(dt);
  }
}

TEST(Nf4Linear, TheBackwardDoesNotNeedTheInput) {
  // A frozen weight has no gradient, so nothing reads x after the forward: changing it in place afterwards
  // (which the engine refuses for a saved tensor) leaves the backward valid.
  manual_seed(8);
  const Nf4Tensor q = nf4_quantize(randn({16, 64}), "w");
  Tensor leaf = randn({4, 64}).set_requires_grad(true);
  Tensor x = mul(leaf, 1.0);
  Tensor y = nf4_linear(x, q);
  x.copy_(zeros({4, 64}));
  sum(y).backward();
  const Tensor want = matmul(ones({4, 16}), nf4_dequantize(q, DType::f32));
  EXPECT_LE(max_abs_diff(leaf.grad(), want), 1e-5);
}

TEST(Nf4Linear, WrongInputsAreErrorsNamingTheWeight) {
  const Nf4Tensor q = nf4_quantize(zeros({16, 64}), "model.layers.0.self_attn.q_proj.weight");
  std::string msg = error_of([&] { nf4_linear(zeros({2, 32}), q); });
  EXPECT_NE(msg.find("q_proj.weight [16, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an input [..., 64], got [2, 32]"), std::string::npos) << msg;
  msg = error_of([&] { nf4_linear(zeros({2, 64}, DType::f64), q); });
  EXPECT_NE(msg.find("q_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
}

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

// Two copies of the tiny Llama fixture with the same adapters: `q` keeps its base in NF4, `ref` holds the
// dequantized NF4 values as ordinary dense weights.
struct Pair {
  std::shared_ptr<models::CausalLM> q, ref;
  models::QuantizedBase report;
};

Pair make_pair_of_models() {
  const nn::LoRAConfig lc{.rank = 8, .alpha = 16, .dropout = 0.0, .target_modules = {"q_proj", "v_proj", "up_proj"}};
  Pair p;
  manual_seed(21);
  p.q = models::load_hf_model(fixture("llama_tiny")).model;
  p.ref = models::load_hf_model(fixture("llama_tiny")).model;
  p.q->train();
  p.ref->train();
  nn::apply_lora(*p.q, lc);
  nn::apply_lora(*p.ref, lc);
  for (auto& [name, t] : nn::lora_state_dict(*p.q)) {  // nonzero B, so the adapters matter from step 0
    Tensor w = t;
    if (name.find("lora_B") != std::string::npos) w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, 0.05));
  }
  p.ref->load_state_dict(p.q->state_dict());
  p.report = models::quantize_base_nf4(*p.q);
  // The reference's base: the NF4 model's dequantized weights, written into its dense parameters.
  NoGradGuard ng;
  std::map<std::string, Tensor> ref_sd = p.ref->state_dict();
  for (auto& [name, m] : p.q->named_modules())
    if (auto l = std::dynamic_pointer_cast<nn::LoRALinear>(m); l && l->frozen_base())
      ref_sd.at(name + ".weight").copy_(l->frozen_base()->dense(DType::f32));
  return p;
}

TEST(QLoRA, Nf4BaseWithAdaptersTrainsAndFollowsLoRAOverTheDequantizedWeights) {
  Pair p = make_pair_of_models();
  const Tensor ids = SafetensorsFile::open(fixture("llama_tiny") + "/reference.safetensors").get("input_ids");
  const Tensor tgt = models::shifted_targets(ids);
  optim::AdamW opt_q(nn::trainable_parameters(*p.q), {.lr = 1e-2, .weight_decay = 0.0});
  optim::AdamW opt_r(nn::trainable_parameters(*p.ref), {.lr = 1e-2, .weight_decay = 0.0});
  ASSERT_EQ(nn::trainable_parameters(*p.q).size(), 12u);  // A and B of 3 projections in 2 layers
  std::vector<double> lq, lr;
  for (int step = 0; step < 25; ++step) {
    Tensor a = p.q->loss(ids, tgt), b = p.ref->loss(ids, tgt);
    lq.push_back(a.item());
    lr.push_back(b.item());
    opt_q.zero_grad();
    opt_r.zero_grad();
    a.backward();
    b.backward();
    opt_q.step();
    opt_r.step();
  }
  EXPECT_LT(lq.back(), 0.7 * lq.front()) << "first " << lq.front() << " last " << lq.back();
  for (size_t i = 0; i < lq.size(); ++i) EXPECT_NEAR(lq[i], lr[i], 1e-4 * std::fabs(lr[i])) << "step " << i;
  for (auto& [name, t] : nn::lora_state_dict(*p.q))
    EXPECT_LE(max_abs_diff(t, p.ref->state_dict().at(name)), 1e-4) << name;
}

TEST(QLoRA, TheModelHoldsNoDenseBaseAndReportsTheQuantizedBytes) {
  Pair p = make_pair_of_models();
  const models::QuantizedBase& r = p.report;
  // Every projection of the 2 blocks (q, k, v, o, gate, up, down); the untied lm_head stays dense.
  EXPECT_EQ(r.tensors, 14);
  int64_t params = 0, bytes = 0;
  for (const std::string& n : r.names) {
    EXPECT_EQ(n.find("lm_head"), std::string::npos) << n;
    const Tensor& w = p.ref->state_dict().at(n);
    params += w.numel();
    bytes += w.numel() / 2 + (w.numel() / 64 + 3) / 4 * 4 + 4 * ((w.numel() / 64 + 255) / 256) + 4 * 256;
    EXPECT_EQ(p.q->state_dict().at(n).numel(), 0) << n;  // registered, empty
  }
  EXPECT_EQ(r.parameters, params);
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_EQ(r.dense_bytes, 4 * params);
  EXPECT_EQ(p.q->num_parameters() + r.parameters, p.ref->num_parameters());
  const models::QuantizedBase now = models::quantized_base(*p.q);
  EXPECT_EQ(now.bytes, r.bytes);
  EXPECT_EQ(now.names, r.names);

  // bf16 compute casts the adapters and the empty placeholders; the base dequantizes to bf16 per product.
  auto [ids, tgt] = testing::repeating_batch(1, 8);  // ids < 64, inside the fixture's vocabulary
  p.q->to(DType::bf16);
  p.ref->to(DType::bf16);
  EXPECT_LE(std::fabs(p.q->loss(ids, tgt).item() - p.ref->loss(ids, tgt).item()), 2e-2);

  // Export: merged weights are the dequantized base plus the adapter, in the placeholder's dtype; restoring the
  // dense base gives back ordinary parameters that compute the same.
  const std::map<std::string, Tensor> merged = nn::merged_state_dict(*p.q), merged_ref = nn::merged_state_dict(*p.ref);
  for (const std::string& n : r.names) EXPECT_LE(max_abs_diff(merged.at(n), merged_ref.at(n)), 1e-2) << n;
  const double before = p.q->loss(ids, tgt).item();
  models::restore_dense_base(*p.q);
  EXPECT_EQ(models::quantized_base(*p.q).tensors, 0);
  EXPECT_EQ(p.q->num_parameters(), p.ref->num_parameters());
  EXPECT_NEAR(p.q->loss(ids, tgt).item(), before, 1e-3 * std::fabs(before));
}

TEST(QLoRA, Gpt2ProjectionsKeepTheirBiasesOverAnNf4Weight) {
  models::HFModel q = models::load_hf_model(fixture("gpt2_tiny")), ref = models::load_hf_model(fixture("gpt2_tiny"));
  const models::QuantizedBase r = models::quantize_base_nf4(*q.model);
  EXPECT_EQ(r.tensors, 8);  // c_attn, c_proj (attention and MLP), c_fc in 2 blocks; the head is tied
  {
    NoGradGuard ng;
    std::map<std::string, Tensor> sd = ref.model->state_dict();
    for (auto& [name, m] : q.model->named_modules())
      if (auto l = std::dynamic_pointer_cast<nn::LoRALinear>(m); l && l->frozen_base())
        sd.at(name + ".weight").copy_(l->frozen_base()->dense(DType::f32));
  }
  auto [ids, tgt] = testing::repeating_batch(2, 10);
  q.model->eval();
  ref.model->eval();
  EXPECT_LE(max_abs_diff(q.model->forward(ids), ref.model->forward(ids)), 1e-5);
}

TEST(QLoRA, BadWeightsAreErrorsNamingTheTensorAndLeaveTheModelAsItWas) {
  struct TwoProjections : nn::Module {
    TwoProjections() {
      register_module("good", std::make_shared<nn::LoRALinear>(64, 8));
      register_module("odd", std::make_shared<nn::LoRALinear>(10, 10));  // 100 elements
    }
  } m;
  std::string msg = error_of([&] { models::quantize_base_nf4(m); });
  EXPECT_NE(msg.find("odd.weight [10, 10] has 100 elements, not a multiple of the block size 64"), std::string::npos)
      << msg;
  EXPECT_EQ(models::quantized_base(m).tensors, 0);  // "good" was not quantized either
  EXPECT_EQ(m.state_dict().at("good.weight").numel(), 512);

  const models::QuantizedBase r = models::quantize_base_nf4(m, {"odd"});  // skipping it works
  EXPECT_EQ(r.names, std::vector<std::string>{"good.weight"});
  msg = error_of([&] { models::quantize_base_nf4(m, {"odd"}); });
  EXPECT_NE(msg.find("good.weight is already quantized"), std::string::npos) << msg;
  auto good = std::dynamic_pointer_cast<nn::LoRALinear>(m.named_children()[0].second);
  EXPECT_NO_THROW(good->merge());  // no adapter: nothing to merge
  nn::LoRAConfig lc;
  lc.target_modules = {"good"};
  nn::apply_lora(m, lc);
  msg = error_of([&] { good->merge(); });
  EXPECT_NE(msg.find("quantized base"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ingot
