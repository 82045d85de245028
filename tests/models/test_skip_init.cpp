// Note [Parameters made to be overwritten] (autograd/nn/layers.h): a model built under nn::SkipInit to have a
// checkpoint loaded into it holds its parameters in the load's dtype, draws nothing but leaves the generator
// where the draws would have, and loads to exactly what a drawn-then-cast model loads to.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/nn/layers.h"
#include "autograd/ops.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "runtime/allocator.h"
#include "runtime/rng.h"
#include "tests/testing.h"

namespace ingot {
namespace {

std::string fixture(const std::string& name) { return std::string(INGOT_SOURCE_DIR) + "/tests/fixtures/hf/" + name; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = contiguous(a), y = contiguous(b);
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST(SkipInit, ParametersComeInItsDtypeAndTheGeneratorMovesAsIfDrawn) {
  const models::HFConfig cfg = models::load_hf_config(fixture("llama_tiny"));
  manual_seed(7);
  auto drawn = models::make_causal_lm(cfg);
  const uint64_t after_drawn = default_generator(Device::cpu()).offset();
  const Tensor next_drawn = randn({5});

  manual_seed(7);
  std::shared_ptr<models::CausalLM> skipped;
  {
    nn::SkipInit skip(DType::bf16);
    EXPECT_EQ(nn::SkipInit::active(), &skip);
    skipped = models::make_causal_lm(cfg);
  }
  EXPECT_EQ(nn::SkipInit::active(), nullptr);
  EXPECT_EQ(default_generator(Device::cpu()).offset(), after_drawn);
  EXPECT_TRUE(same_bytes(randn({5}), next_drawn)) << "a draw after the model differs";
  const auto a = drawn->named_parameters(), b = skipped->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(b[i].second.dtype(), DType::bf16) << b[i].first;
  }
  // Outside the guard the layers draw again.
  EXPECT_EQ(nn::Linear(4, 3).named_parameters()[0].second.dtype(), DType::f32);
}

TEST(SkipInit, GuardsNestAndTheInnermostWins) {
  nn::SkipInit outer(DType::f16);
  {
    nn::SkipInit inner(DType::bf16);
    EXPECT_EQ(nn::RMSNorm(8).named_parameters()[0].second.dtype(), DType::bf16);
  }
  EXPECT_EQ(nn::RMSNorm(8).named_parameters()[0].second.dtype(), DType::f16);
}

// load_hf_model builds under the guard: the loaded model equals, byte for byte, one drawn in f32, cast and loaded
// (the previous way), for every fixture architecture and dtype; and a bf16 load never holds an f32 copy of the
// model (the CPU allocator's peak stays below the f32 model's bytes).
TEST(SkipInit, LoadedModelsEqualDrawnThenCastOnesAndBf16LoadsHoldNoF32Copy) {
  for (const char* name : {"llama_tiny", "gpt2_tiny", "qwen2_tiny"}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)));
      const models::HFConfig cfg = models::load_hf_config(fixture(name));
      auto before = models::make_causal_lm(cfg);
      if (dt != DType::f32) before->to(dt);
      models::load_hf_weights(*before, cfg, fixture(name));
      int64_t f32_bytes = 0;
      for (const auto& [n, p] : before->named_parameters()) f32_bytes += p.numel() * 4;

      cpu_allocator().reset_peak();
      const int64_t base = cpu_allocator().stats().allocated_bytes;
      models::HFModel m = models::load_hf_model(fixture(name), dt);
      const int64_t peak = cpu_allocator().stats().peak_allocated_bytes - base;
      const auto want = before->state_dict(), got = m.model->state_dict();
      ASSERT_EQ(want.size(), got.size());
      for (const auto& [n, t] : want) {
        ASSERT_TRUE(got.count(n)) << n;
        EXPECT_TRUE(same_bytes(got.at(n), t)) << n;
      }
      if (dt == DType::bf16) EXPECT_LT(peak, f32_bytes) << "peak " << peak << " B during a bf16 load";
    }
  }
}

// Note [Initial values drawn later] (autograd/nn/layers.h): every parameter a guard skipped can be drawn later in
// slices, alone and in any order, each equal byte for byte to the same elements of the model drawn whole (normal
// weights, PyTorch-default uniform Linear weights and biases, ones and zeros), also cast to bf16.
TEST(SkipInit, SkippedParametersDrawAnySliceLaterAsTheWholeDrawWouldHave) {
  const models::HFConfig cfg = models::load_hf_config(fixture("gpt2_tiny"));
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(9);
    auto drawn = models::make_causal_lm(cfg);
    nn::Linear plain(6, 5);  // U(-1/sqrt(6), 1/sqrt(6)) weight and bias
    drawn->to(dt);
    plain.to(dt);
    manual_seed(9);
    nn::SkipInit skip(dt, Device::cpu());
    auto skipped = models::make_causal_lm(cfg);
    nn::Linear later(6, 5);
    std::vector<Tensor> want = drawn->parameters(), got = skipped->parameters();
    for (const Tensor& p : plain.parameters()) want.push_back(p);
    for (const Tensor& p : later.parameters()) got.push_back(p);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = got.size(); i-- > 0;) {  // last first: nothing depends on the order of the draws
      const int64_t n = got[i].numel(), cut = n / 3;
      Tensor a = empty({cut}, dt), b = empty({n - cut}, dt);
      skip.deferred(got[i]).fill(cut, n, b);
      skip.deferred(got[i]).fill(0, cut, a);
      const Tensor flat = reshape(want[i], {n});
      EXPECT_TRUE(same_bytes(a, narrow(flat, 0, 0, cut))) << want[i].name();
      EXPECT_TRUE(same_bytes(b, narrow(flat, 0, cut, n - cut))) << want[i].name();
    }
  }
}

}  // namespace
}  // namespace ingot
