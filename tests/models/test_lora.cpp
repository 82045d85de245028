#include <gtest/gtest.h>

#include <array>
#include <filesystem>

#include "../testing.h"
#include "autograd/nn/lora.h"
#include "models/decoder.h"
#include "models/gpt2.h"
#include "models/hf_checkpoint.h"
#include "models/peft.h"
#include "optim/optimizer.h"
#include "runtime/file_util.h"
#include "runtime/safetensors.h"
#include "tiny_models.h"

namespace ingot {
namespace {

using nn::LoRAConfig;
using nn::LoRALinear;

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

// Gives every lora_B a nonzero value so the adapters change the output (B starts at zero, as in PEFT).
void perturb_adapters(nn::Module& m, double std = 0.05) {
  for (auto& [name, t] : nn::lora_state_dict(m))
    if (name.find("lora_B") != std::string::npos) {
      Tensor w = t;
      w.copy_(randn(t.shape(), t.dtype(), t.device(), 0.0, std));
    }
}

TEST(LoRA, LinearGradientsFlowOnlyToTheAdaptersAndMatchFiniteDifferencesInF64) {
  manual_seed(11);
  LoRALinear lin(6, 5, true);
  lin.to(DType::f64);
  lin.add_lora({.rank = 3, .alpha = 6.0, .dropout = 0.0, .target_modules = {"x"}});
  perturb_adapters(lin, 0.5);
  auto sd = lin.state_dict();
  Tensor W = sd.at("weight"), b = sd.at("bias"), A = sd.at("lora_A.weight"), B = sd.at("lora_B.weight");
  EXPECT_FALSE(W.requires_grad());
  EXPECT_FALSE(b.requires_grad());
  EXPECT_TRUE(A.requires_grad() && B.requires_grad());
  EXPECT_EQ(A.shape(), (Shape{3, 6}));
  EXPECT_EQ(B.shape(), (Shape{5, 3}));
  EXPECT_DOUBLE_EQ(lin.lora_scale(), 2.0);

  Tensor x = testing::leaf(randn({4, 6}, DType::f64));
  // Against the definition, through gradcheck on x, A and B as explicit inputs.
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{add(linear(in[0], W, b), mul(linear(linear(in[0], in[1]), in[2]), 2.0))};
      },
      {x, testing::leaf(A), testing::leaf(B)});
  // The module computes the same function, and backward leaves the base weight without a gradient.
  Tensor y = lin.forward(x);
  Tensor want = add(linear(x, W, b), mul(linear(linear(x, A), B), 2.0));
  EXPECT_LE(max_rel_error(y, want, 1e-12, 1e-12), 1.0);
  sum(mul(y, y)).backward();
  EXPECT_FALSE(W.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_TRUE(A.grad().defined() && B.grad().defined());
  // The module's gradients equal finite differences of its own forward.
  std::vector<double> ga = A.grad().to_vector();
  double* a = A.data<double>();
  for (int64_t i : {0, 7, 17}) {
    NoGradGuard ng;
    const double orig = a[i], eps = 1e-6;
    a[i] = orig + eps;
    Tensor yp = lin.forward(x);
    const double lp = sum(mul(yp, yp)).item();
    a[i] = orig - eps;
    Tensor ym = lin.forward(x);
    const double lm = sum(mul(ym, ym)).item();
    a[i] = orig;
    EXPECT_NEAR(ga[i], (lp - lm) / (2 * eps), 1e-6 * std::max(1.0, std::abs(ga[i])));
  }
}

// Counts the linear ops applied while alive (the op profiler's hook sees every primitive application).
class LinearCount final : public OpProfilerHook {
 public:
  LinearCount() { set_op_profiler_hook(this); }
  ~LinearCount() override { set_op_profiler_hook(nullptr); }
  void begin_op(const Primitive& p) override { linears += p.name() == "linear" ? 1 : 0; }
  void end_op(const Primitive&, const std::vector<Tensor>&, const std::vector<Tensor>&) override {}
  int linears = 0;
};

// Note [Adapters of one input] (autograd/nn/lora.h): q/k/v-like projections of one input whose A-products run as
// one product give each projection's forward() values and the same gradients of x, every A and every B (f64: the
// same sums up to their order), and the joint product is really one (one A-product among the ops applied). A
// projection of another scale, or with dropout while training, sends all of them through their own forward().
TEST(LoRA, AdaptersOfOneInputShareTheirAProductAndGiveEachProjectionsValuesAndGradients) {
  manual_seed(12);
  auto make = [](int64_t out, double alpha) {
    auto p = std::make_shared<LoRALinear>(6, out, false);
    p->to(DType::f64);
    p->add_lora({.rank = 2, .alpha = alpha, .dropout = 0.0, .target_modules = {"x"}});
    perturb_adapters(*p, 0.5);
    return p;
  };
  for (const double k_alpha : {4.0, 8.0}) {  // 8: another scale than q's and v's, so no joint product
    SCOPED_TRACE(k_alpha == 4.0 ? "one scale" : "k of another scale");
    std::vector<std::shared_ptr<LoRALinear>> ps{make(5, 4.0), make(3, k_alpha), make(3, 4.0)};
    Tensor x = testing::leaf(randn({2, 4, 6}, DType::f64));
    std::vector<Tensor> alone, shared, g_alone, g_shared;
    for (auto& p : ps) alone.push_back(p->forward(x));
    std::vector<Tensor> cot;
    for (const Tensor& y : alone) cot.push_back(randn(y.shape(), DType::f64));
    auto backward = [&](const std::vector<Tensor>& ys, std::vector<Tensor>& grads) {
      Tensor total;
      for (size_t i = 0; i < ys.size(); ++i) {
        Tensor l = sum(mul(ys[i], cot[i]));
        total = total.defined() ? add(total, l) : l;
      }
      total.backward();
      grads.push_back(x.grad().clone_raw());
      x.zero_grad();
      for (auto& p : ps)
        for (auto& [name, t] : nn::lora_state_dict(*p)) {
          grads.push_back(t.grad().clone_raw());
          Tensor tt = t;
          tt.zero_grad();
        }
    };
    backward(alone, g_alone);
    {
      LinearCount count;
      for (const nn::LoRAParts& p : LoRALinear::forward_shared_input_parts({ps[0].get(), ps[1].get(), ps[2].get()}, x))
        shared.push_back(p.sum());
      // 3 base products and 3 B-products, and the A-products: one joint, or one per projection.
      EXPECT_EQ(count.linears, k_alpha == 4.0 ? 7 : 9);
    }
    backward(shared, g_shared);
    for (size_t i = 0; i < alone.size(); ++i)
      EXPECT_LE(max_rel_error(shared[i], alone[i], 1e-12, 1e-12), 1.0) << "projection " << i;
    ASSERT_EQ(g_shared.size(), g_alone.size());
    for (size_t i = 0; i < g_alone.size(); ++i)
      EXPECT_LE(max_rel_error(g_shared[i], g_alone[i], 1e-12, 1e-12), 1.0) << "gradient " << i;
  }
}

TEST(LoRA, AFreshAdapterLeavesTheOutputUnchangedAndMergingKeepsIt) {
  manual_seed(12);
  models::Llama model(testing::tiny_llama_config());
  auto [ids, tgt] = testing::repeating_batch(2, 6);
  Tensor base = model.forward(ids);
  // q and k: their adapters' updates are added inside the rotation (Note [Rope of a sum]); v and down_proj's outside.
  auto adapted = nn::apply_lora(
      model, {.rank = 4, .alpha = 8, .dropout = 0.1, .target_modules = {"q_proj", "k_proj", "v_proj", "down_proj"}});
  EXPECT_EQ(adapted.size(), 8u);  // 2 layers x 4 projections
  model.eval();
  EXPECT_EQ(model.forward(ids).to_vector(), base.to_vector());  // B = 0
  perturb_adapters(model);
  Tensor unmerged = model.forward(ids);
  EXPECT_GT(max_rel_error(unmerged, base, 0, 1e-4), 1.0);  // the adapters now matter
  // The merged state dict in a fresh model without adapters reproduces the adapted model.
  models::Llama fresh(testing::tiny_llama_config());
  fresh.load_state_dict(nn::merged_state_dict(model));
  fresh.eval();
  EXPECT_LE(max_rel_error(fresh.forward(ids), unmerged, 1e-5, 1e-6), 1.0);
  // Merging in place skips the adapters afterwards and gives the same logits.
  for (auto& [n, m] : model.named_modules())
    if (auto l = std::dynamic_pointer_cast<LoRALinear>(m)) l->merge();
  EXPECT_LE(max_rel_error(model.forward(ids), unmerged, 1e-5, 1e-6), 1.0);
}

// Note [Residual of a sum] (models/decoder.cpp): an adapter update far below half an ulp of down_proj's bf16 output
// (an adapter's first steps; here ~1e-6 of outputs ~1) still reaches a bf16 block's output, as it does in
// torch.compile's fused kernel: x + base is an f32 value with a few more bits than bf16 (often exactly halfway between
// two bf16 values), and the update, added before the one rounding, moves those to its side. Rounded into base + delta
// first, the update is lost (2 of the block's 8,192 outputs changed that way, 51 with the sum rounded once), and every
// output it moves, it moves the way the f64 block moves. (down_proj's sum is the block's last op; o_proj's goes
// through the same residual_add.)
TEST(LoRA, ATinyDownProjUpdateReachesABf16BlocksOutputWithTheF64ChangesSign) {
  manual_seed(16);
  models::LlamaConfig cfg = testing::tiny_llama_config();
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.num_hidden_layers = 1;
  models::Llama model(cfg);
  nn::apply_lora(model, {.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = {"down_proj"}});
  model.eval();
  std::shared_ptr<models::DecoderBlock> block;
  for (auto& [name, m] : model.named_modules())
    if (auto b = std::dynamic_pointer_cast<models::DecoderBlock>(m)) block = b;
  ASSERT_TRUE(block);
  const Tensor h0 = randn({8, 16, cfg.hidden_size});
  perturb_adapters(model, 2e-5);
  model.to(DType::bf16);
  Tensor b;
  for (auto& [name, t] : nn::lora_state_dict(model))
    if (name.find("lora_B") != std::string::npos) b = t;
  const Tensor tiny = b.clone_raw();
  auto change = [&](DType dt) {  // the block's output with the update minus without, in f64
    NoGradGuard ng;
    for (auto& [name, t] : nn::lora_state_dict(model))
      if (name.find("lora_B") != std::string::npos) b = t;
    b.copy_(tiny.to(dt));
    const Tensor with = block->forward(h0.to(dt)).to(DType::f64);
    b.copy_(zeros(b.shape(), dt));
    return sub(with, block->forward(h0.to(dt)).to(DType::f64));
  };
  const std::vector<double> in_bf16 = change(DType::bf16).to_vector();
  model.to(DType::f64);  // the same (bf16-rounded) weights, computed in f64
  const std::vector<double> in_f64 = change(DType::f64).to_vector();
  int moved = 0, agree = 0;
  for (size_t i = 0; i < in_bf16.size(); ++i)
    if (in_bf16[i] != 0) {
      ++moved;
      agree += (in_bf16[i] > 0) == (in_f64[i] > 0);
    }
  EXPECT_GE(moved, 20) << "of " << in_bf16.size() << " outputs";
  EXPECT_GE(agree, moved * 9 / 10) << moved << " moved";
}

// Note [SwiGLU of sums]: tiny updates (B of 2e-5) of the MLP's widening projections move a bf16 MLP's widened output
// where the f64 result rounded to bf16 moves (one rounding), and the way f64 moves it. Returns {moved, agreeing,
// moved by one rounding of f64}.
template <typename Model, typename Config>
std::array<int, 3> tiny_widening_updates(Config cfg, const std::vector<std::string>& targets) {
  manual_seed(17);
  Model model(cfg);
  nn::apply_lora(model, {.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = targets});
  model.eval();
  std::shared_ptr<models::DecoderMLP> mlp;
  for (auto& [name, m] : model.named_modules())
    if (auto p = std::dynamic_pointer_cast<models::DecoderMLP>(m)) mlp = p;
  EXPECT_TRUE(mlp);
  const Tensor x0 = randn({8, 16, 64});
  perturb_adapters(model, 2e-5);
  model.to(DType::bf16);
  std::vector<Tensor> tiny;
  for (auto& [name, t] : nn::lora_state_dict(model))
    if (name.find("lora_B") != std::string::npos) tiny.push_back(t.clone_raw());
  // The MLP's widened output with the updates and without, in f64.
  auto outputs = [&](DType dt) {
    NoGradGuard ng;
    std::vector<Tensor> bs;
    for (auto& [name, t] : nn::lora_state_dict(model))
      if (name.find("lora_B") != std::string::npos) bs.push_back(t);
    for (size_t i = 0; i < bs.size(); ++i) bs[i].copy_(tiny[i].to(dt));
    const Tensor with = mlp->widen(x0.to(dt)).to(DType::f64);
    for (Tensor& b : bs) b.copy_(zeros(b.shape(), dt));
    return std::pair{with, mlp->widen(x0.to(dt)).to(DType::f64)};
  };
  const auto [w16, wo16] = outputs(DType::bf16);
  model.to(DType::f64);  // the same (bf16-rounded) weights, computed in f64
  const auto [w64, wo64] = outputs(DType::f64);
  const std::vector<double> got = sub(w16, wo16).to_vector(), exact = sub(w64, wo64).to_vector();
  const std::vector<double> ideal = sub(w64.to(DType::bf16).to(DType::f64), wo64.to(DType::bf16).to(DType::f64)).to_vector();
  std::array<int, 3> r{0, 0, 0};
  for (size_t i = 0; i < got.size(); ++i) {
    r[2] += ideal[i] != 0;
    if (got[i] != 0) {
      ++r[0];
      r[1] += (got[i] > 0) == (exact[i] > 0);
    }
  }
  std::printf("[ lora     ] %s updates moved %d of %zu bf16 outputs (%d the way f64 does); one rounding of f64 moves %d\n",
              targets[0].c_str(), r[0], got.size(), r[1], r[2]);
  return r;
}

// Rounding gate's and up's sums before the activation (INGOT_LORA_ROUNDED_SUMS=1) moved 1,993 outputs where one
// rounding moves 3,612.
TEST(LoRA, TinyGateAndUpUpdatesMoveABf16MlpAsOneRoundingOfF64Does) {
  models::LlamaConfig cfg = testing::tiny_llama_config();
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.num_hidden_layers = 1;
  const auto [moved, agree, should] = tiny_widening_updates<models::Llama>(cfg, {"gate_proj", "up_proj"});
  EXPECT_GE(moved, should * 9 / 10);
  EXPECT_GE(agree, moved * 9 / 10) << moved << " moved";
}

// GPT-2's GELU (gelu_tanh_sum): the rounded sum moved 2,027 outputs where one rounding moves 3,881.
TEST(LoRA, TinyCFcUpdatesMoveABf16Gpt2MlpAsOneRoundingOfF64Does) {
  models::GPT2Config cfg = testing::tiny_gpt2_config();
  cfg.n_embd = 64;
  cfg.n_layer = 1;
  const auto [moved, agree, should] = tiny_widening_updates<models::GPT2>(cfg, {"c_fc"});
  EXPECT_GE(moved, should * 9 / 10);
  EXPECT_GE(agree, moved * 9 / 10) << moved << " moved";
}

TEST(LoRA, OnlyAdaptersAreTrainableAndOnlyTheyReceiveGradients) {
  manual_seed(13);
  models::GPT2 model(testing::tiny_gpt2_config());
  nn::apply_lora(model, {.rank = 2, .alpha = 4, .dropout = 0.0, .target_modules = {"c_attn"}});
  perturb_adapters(model);
  auto trainable = nn::trainable_parameters(model);
  EXPECT_EQ(trainable.size(), 4u);  // lora_A and lora_B in 2 layers
  auto [ids, tgt] = testing::repeating_batch(2, 6);
  model.loss(ids, tgt).backward();
  for (auto& [name, p] : model.named_parameters()) {
    const bool adapter = name.find(".lora_") != std::string::npos;
    EXPECT_EQ(p.grad().defined(), adapter) << name;
    EXPECT_EQ(p.requires_grad(), adapter) << name;
  }
  EXPECT_EQ(trainable[0].name(), "transformer.h.0.attn.c_attn.lora_A.weight");
}

// Note [Logits in chunks]: a frozen head's loss comes from the hidden states without the logits (Llama's own head
// and GPT-2's tied one): the same loss and adapter gradients as the loss of the logits, in f64; an adapted head
// goes through the logits.
TEST(LoRA, AFrozenHeadsLossWithoutTheLogitsEqualsTheLossOfTheLogits) {
  auto check = [](nn::Module& model, models::CausalLM& lm, const std::string& what) {
    SCOPED_TRACE(what);
    perturb_adapters(model);
    auto [ids, tgt] = testing::repeating_batch(2, 6);
    Tensor fused = lm.loss(ids, tgt);
    fused.backward();
    std::map<std::string, Tensor> g1;
    for (auto& [name, p] : model.named_parameters())
      if (p.grad().defined()) g1[name] = clone(p.grad());
    model.zero_grad();
    // train.loss_chunks: 3 chunks of the 12 rows, then all at once; the same loss.
    for (int64_t chunks : {3, 1}) {
      lm.set_loss_chunks(chunks);
      EXPECT_NEAR(lm.loss(ids, tgt).item(), fused.item(), 1e-12) << chunks << " chunks";
    }
    lm.set_loss_chunks(0);
    Tensor plain = models::lm_loss(lm.forward(ids), tgt);
    plain.backward();
    EXPECT_NEAR(fused.item(), plain.item(), 1e-12);
    ASSERT_FALSE(g1.empty());
    for (auto& [name, p] : model.named_parameters()) {
      if (!p.grad().defined()) continue;
      ASSERT_TRUE(g1.count(name)) << name;
      EXPECT_LE(max_rel_error(g1[name], p.grad(), 1e-10, 1e-13), 1.0) << name;
    }
  };
  manual_seed(16);
  models::LlamaConfig lc = testing::tiny_llama_config();
  lc.tie_word_embeddings = false;
  models::Llama llama(lc);
  llama.to(DType::f64);
  nn::apply_lora(llama, {.rank = 2, .alpha = 4, .dropout = 0.0, .target_modules = {"q_proj", "v_proj"}});
  check(llama, llama, "llama, frozen lm_head");
  models::GPT2 gpt2(testing::tiny_gpt2_config());
  gpt2.to(DType::f64);
  nn::apply_lora(gpt2, {.rank = 2, .alpha = 4, .dropout = 0.0, .target_modules = {"c_attn"}});
  check(gpt2, gpt2, "gpt2, frozen tied head");
  models::Llama adapted_head(lc);
  adapted_head.to(DType::f64);
  nn::apply_lora(adapted_head, {.rank = 2, .alpha = 4, .dropout = 0.0, .target_modules = {"q_proj", "lm_head"}});
  check(adapted_head, adapted_head, "llama, adapted lm_head (through the logits)");
}

// Every adapter of every projection (attention and MLP, all-linear) gets the gradient of the chain rule through its
// merged weight W' = W + s B A: with G = dL/dW' (a copy of the model with W' trainable), dB = s G A^T and
// dA = s B^T G. f32 on the CPU, for Llama (SwiGLU) and GPT-2 (fused c_attn, GELU).
TEST(LoRA, EveryAdaptersGradientIsTheChainRuleThroughItsMergedWeight) {
  for (const char* name : {"llama_tiny", "gpt2_tiny"}) {
    SCOPED_TRACE(name);
    manual_seed(23);
    models::HFModel m = models::load_hf_model(fixture(name));
    models::HFModel merged = models::load_hf_model(fixture(name));
    const std::vector<std::string> all_linear =
        std::string(name) == "gpt2_tiny"
            ? std::vector<std::string>{"c_attn", "c_proj", "c_fc"}
            : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    const LoRAConfig cfg{.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = all_linear};
    const std::vector<std::string> adapted = nn::apply_lora(*m.model, cfg);
    ASSERT_GE(adapted.size(), 8u);
    perturb_adapters(*m.model, 0.1);
    std::map<std::string, std::shared_ptr<nn::Module>> mods;
    for (auto& [n, mod] : m.model->named_modules()) mods[n] = mod;
    std::map<std::string, Tensor> targets;
    for (auto& [n, p] : merged.model->named_parameters()) targets[n] = p;
    for (const std::string& a : adapted) {
      auto l = std::dynamic_pointer_cast<LoRALinear>(mods.at(a));
      Tensor w = targets.at(a + ".weight");
      w.copy_(l->merged_weight());
    }
    Tensor ids = SafetensorsFile::open(fixture(name) + "/reference.safetensors").get("input_ids");
    Tensor tgt = models::shifted_targets(ids);
    Tensor loss = m.model->loss(ids, tgt), loss_merged = merged.model->loss(ids, tgt);
    EXPECT_NEAR(loss.item(), loss_merged.item(), 1e-5 * std::abs(loss.item()));
    loss.backward();
    loss_merged.backward();
    std::map<std::string, Tensor> lora;
    for (auto& [n, t] : nn::lora_state_dict(*m.model)) lora[n] = t;
    for (const std::string& a : adapted) {
      SCOPED_TRACE(a);
      auto l = std::dynamic_pointer_cast<LoRALinear>(mods.at(a));
      const Tensor A = lora.at(a + ".lora_A.weight"), B = lora.at(a + ".lora_B.weight");
      Tensor G = targets.at(a + ".weight").grad();
      ASSERT_TRUE(G.defined() && A.grad().defined() && B.grad().defined());
      // GPT-2's Conv1D weights are [in, out] in the checkpoint but [out, in] here, as W' = W + s B A.
      const double s = l->lora_scale();
      Tensor want_b = mul(matmul(G, transpose(A, 0, 1)), s), want_a = mul(matmul(transpose(B, 0, 1), G), s);
      EXPECT_LE(max_rel_error(B.grad(), want_b, 1e-4, 1e-6), 1.0) << "dB";
      EXPECT_LE(max_rel_error(A.grad(), want_a, 1e-4, 1e-6), 1.0) << "dA";
      double largest = 0;
      for (double v : want_b.to_vector()) largest = std::max(largest, std::abs(v));
      EXPECT_GT(largest, 1e-6) << "the chain rule's dB must not be zero for the check to mean anything";
    }
  }
}

TEST(LoRA, AdamWOnTheAdaptersAloneLowersTheLossAndLeavesTheBaseUnchanged) {
  manual_seed(15);
  models::HFModel m = models::load_hf_model(fixture("llama_tiny"));
  m.model->train();
  nn::apply_lora(*m.model, {.rank = 8, .alpha = 16, .dropout = 0.0, .target_modules = {"q_proj", "v_proj", "up_proj"}});
  const std::vector<double> base_q = m.model->state_dict().at("model.layers.0.self_attn.q_proj.weight").to_vector();
  Tensor ids = SafetensorsFile::open(fixture("llama_tiny") + "/reference.safetensors").get("input_ids");
  Tensor tgt = models::shifted_targets(ids);
  optim::AdamW opt(nn::trainable_parameters(*m.model), {.lr = 1e-2, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    Tensor loss = m.model->loss(ids, tgt);
    if (step == 0) first = loss.item();
    last = loss.item();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
  EXPECT_EQ(m.model->state_dict().at("model.layers.0.self_attn.q_proj.weight").to_vector(), base_q);
}

TEST(LoRA, BadConfigurationsAreErrors) {
  models::Llama model(testing::tiny_llama_config());
  try {
    nn::apply_lora(model, {.rank = 2, .alpha = 4, .dropout = 0, .target_modules = {"c_attn"}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c_attn' matches no projection"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q_proj"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nn::apply_lora(model, {.rank = 0, .alpha = 4, .dropout = 0, .target_modules = {"q_proj"}}), Error);
  models::Llama m2(testing::tiny_llama_config());
  EXPECT_THROW(nn::apply_lora(m2, {.rank = 2, .alpha = 4, .dropout = 1.0, .target_modules = {"q_proj"}}), Error);
  models::Llama m3(testing::tiny_llama_config());
  nn::apply_lora(m3, {.rank = 2, .alpha = 4, .dropout = 0, .target_modules = {"q_proj"}});
  EXPECT_THROW(nn::apply_lora(m3, {.rank = 2, .alpha = 4, .dropout = 0, .target_modules = {"q_proj"}}), Error);
  EXPECT_THROW(nn::apply_lora(m3, {.rank = 2, .alpha = 4, .dropout = 0, .target_modules = {}}), Error);
}

TEST(LoRA, PeftAdapterRoundTripsAndExportMergesIntoHfWeights) {
  TempDir tmp("ingot_lora_");
  manual_seed(14);
  models::HFModel m = models::load_hf_model(fixture("qwen2_tiny"));
  LoRAConfig cfg{.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = {"q_proj", "v_proj"}};
  nn::apply_lora(*m.model, cfg);
  perturb_adapters(*m.model);
  Tensor ids = SafetensorsFile::open(fixture("qwen2_tiny") + "/reference.safetensors").get("input_ids");
  Tensor want = m.model->forward(ids);

  models::save_lora_adapter(*m.model, cfg, m.config, tmp.file("adapter"), "qwen2_tiny");
  SafetensorsFile saved = SafetensorsFile::open(tmp.file("adapter") + "/adapter_model.safetensors");
  EXPECT_EQ(saved.names().size(), 8u);  // only adapters: 2 layers x 2 modules x (A, B)
  EXPECT_TRUE(saved.has("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_NE(read_file(tmp.file("adapter") + "/adapter_config.json").find("\"peft_type\": \"LORA\""), std::string::npos);

  models::HFModel again = models::load_hf_model(fixture("qwen2_tiny"));
  LoRAConfig back = models::load_lora_adapter(*again.model, tmp.file("adapter"));
  EXPECT_EQ(back.rank, 4);
  EXPECT_EQ(back.target_modules, cfg.target_modules);
  EXPECT_EQ(again.model->forward(ids).to_vector(), want.to_vector());

  // Export merges: a plain load of the exported checkpoint gives the adapted logits.
  models::save_hf_model(*again.model, again.config, tmp.file("merged"));
  SafetensorsFile merged = SafetensorsFile::open(tmp.file("merged") + "/model.safetensors");
  for (const std::string& n : merged.names()) EXPECT_EQ(n.find("lora"), std::string::npos) << n;
  EXPECT_LE(max_rel_error(models::load_hf_model(tmp.file("merged")).model->forward(ids), want, 1e-4, 1e-5), 1.0);
}

TEST(LoRA, AdapterFilesWithUnsupportedOptionsOrWrongShapesAreRejected) {
  TempDir tmp("ingot_lora_");
  models::HFModel m = models::load_hf_model(fixture("llama_tiny"));
  LoRAConfig cfg{.rank = 4, .alpha = 8, .dropout = 0.0, .target_modules = {"q_proj"}};
  nn::apply_lora(*m.model, cfg);
  models::save_lora_adapter(*m.model, cfg, m.config, tmp.file("a"));
  const std::string conf = read_file(tmp.file("a") + "/adapter_config.json");
  auto rewrite = [&](const std::string& from, const std::string& to) {
    std::string s = conf;
    s.replace(s.find(from), from.size(), to);
    write_file_atomic(tmp.file("a") + "/adapter_config.json", [&](std::FILE* f) { write_bytes(f, s.data(), s.size()); });
  };
  auto error_of = [&] {
    models::HFModel fresh = models::load_hf_model(fixture("llama_tiny"));
    try {
      models::load_lora_adapter(*fresh.model, tmp.file("a"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  rewrite("\"use_rslora\": false", "\"use_rslora\": true");
  EXPECT_NE(error_of().find("use_rslora"), std::string::npos);
  rewrite("\"r\": 4", "\"r\": 2");
  EXPECT_NE(error_of().find("[2, 64]"), std::string::npos) << error_of();
  rewrite("\"q_proj\"", "\"k_proj\"");
  EXPECT_NE(error_of().find("missing adapter tensors"), std::string::npos) << error_of();
  models::HFModel plain = models::load_hf_model(fixture("llama_tiny"));
  EXPECT_THROW(models::save_lora_adapter(*plain.model, cfg, plain.config, tmp.file("b")), Error);
}

}  // namespace
}  // namespace ingot
