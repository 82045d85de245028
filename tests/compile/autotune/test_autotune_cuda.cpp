// max-autotune on CUDA (compile/autotune/cuda/tuner.h, runtime/kernels/cuda/matmul_tuning.h). Without a GPU:
// the candidate launch configs, their database text and the kernel keys. On the GPU: launch configs timed
// once and then read from the database, cuBLASLt algorithms timed once per signature with results equal to
// the first heuristic's (and the output untouched by the timing runs), and a whole GPT-2 step compiled with
// max-autotune against default mode, a second compile timing nothing, a zero budget timing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "compile/step_fixture.h"
#include "runtime/file_util.h"
#include "tests/compile/codegen/test_codegen_cuda_util.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/testing.h"

#ifdef INGOT_WITH_CUDA_CODEGEN
#include "compile/autotune/cuda/tuner.h"
#include "runtime/kernels/cuda/matmul_tuning.h"
#include "runtime/kernels/kernels.h"
#endif

namespace ingot::autotune {
namespace {

#ifndef INGOT_WITH_CUDA_CODEGEN
TEST(AutotuneCuda, NeedsACudaBuild) {
  INGOT_REQUIRE_CUDA();
  GTEST_SKIP() << "built without the CUDA code generator (INGOT_CUDA=OFF)";
}
#else

using codegen::KernelKind;
using codegen::KernelSpec;
using codegen::Op;
using codegen::SymInt;
using codegen::cuda::KernelAbi;
using codegen::cuda::LaunchConfig;
using ingot::testing::StepRun;
using ingot::testing::train_steps;

const Device kGpu = Device::cuda(0);

std::set<std::string> encodings(const std::vector<LaunchConfig>& cs) {
  std::set<std::string> out;
  for (const LaunchConfig& c : cs) out.insert(encode_config(c));
  return out;
}

TEST(AutotuneCandidates, StartWithTheHeuristicAndHaveNoDuplicates) {
  const LaunchConfig base;
  KernelAbi pw;
  pw.kind = KernelKind::Pointwise;
  pw.vector_width = 4;
  std::vector<LaunchConfig> c = launch_candidates(pw, base);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(encode_config(c[0]), encode_config(base));
  EXPECT_EQ(c.size(), 16u) << "4 block sizes x 2 grid caps x vector/scalar";
  EXPECT_EQ(encodings(c).size(), c.size());
  pw.vector_width = 1;  // no vector path: nothing to choose there
  EXPECT_EQ(launch_candidates(pw, base).size(), 8u);

  KernelAbi rows;
  rows.kind = KernelKind::RowReduction;
  rows.vector_width = 4;
  c = launch_candidates(rows, base);
  EXPECT_EQ(c.size(), 1u + 2 * (2 + 5)) << "the heuristic, then warp per row x 2 (128, 256 threads: "
                                          "kWarpRowMaxThreads), block per row x 5, each x 2 paths";
  EXPECT_EQ(encodings(c).size(), c.size());
  rows.prefer_columns = true;
  c = launch_candidates(rows, base);
  EXPECT_EQ(c.size(), 1u + 2 * (2 + 5 + 4 * 3));
  for (const LaunchConfig& x : c) {
    if (x.rows == LaunchConfig::Rows::WarpPerRow) {
      EXPECT_LE(x.block_threads, codegen::cuda::kWarpRowMaxThreads);
    }
  }
  for (const LaunchConfig& x : c) {
    if (x.rows == LaunchConfig::Rows::Columns) {
      EXPECT_LE(x.col_rows * std::max(x.col_splits, 1), 1024);
    }
  }

  KernelAbi multi;
  multi.kind = KernelKind::MultiTensor;
  EXPECT_EQ(launch_candidates(multi, base).size(), 1u);
}

TEST(AutotuneCandidates, ConfigTextRoundTripsAndRejectsWhatItDidNotWrite) {
  KernelAbi rows;
  rows.kind = KernelKind::RowReduction;
  rows.vector_width = 4;
  rows.prefer_columns = true;
  for (const LaunchConfig& c : launch_candidates(rows, LaunchConfig{})) {
    LaunchConfig back;
    back.block_threads = 32;
    back.vectorize = !c.vectorize;
    ASSERT_TRUE(decode_config(encode_config(c), back)) << encode_config(c);
    EXPECT_EQ(encode_config(back), encode_config(c));
  }
  const std::string good = "block=256 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=1 waves=8";
  LaunchConfig cfg;
  EXPECT_TRUE(decode_config(good, cfg));
  EXPECT_EQ(cfg.rows, LaunchConfig::Rows::WarpPerRow);
  for (const std::string bad : {"", "block=256", "block=100 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=1 waves=8",
                                "block=256 rows=diag rbt=0 cr=32 cs=0 gs=0 vec=1 waves=8",
                                "block=256 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=2 waves=8",
                                "block=256 block=256 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=1",
                                "block=256 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=1 waves=8 extra=1",
                                "block=2x6 rows=warp rbt=0 cr=32 cs=0 gs=0 vec=1 waves=8"}) {
    LaunchConfig x;
    EXPECT_FALSE(decode_config(bad, x)) << bad;
  }
}

// out = relu(x) over [rows, cols], f32.
KernelSpec relu_spec(int64_t rows, int64_t cols, const std::string& name) {
  KernelSpec k;
  k.name = name;
  k.dims = {SymInt::constant(rows), SymInt::constant(cols)};
  const int ix = k.input(DType::f32, k.contiguous_strides(), "x");
  const int io = k.output(DType::f32, k.contiguous_strides(), "out");
  k.store(io, k.unary(Op::Relu, k.load(ix)));
  return k;
}

// y = softmax(x) over the last dim of [rows, cols], f32.
KernelSpec softmax_spec(int64_t rows, int64_t cols) {
  KernelSpec k;
  k.kind = KernelKind::RowReduction;
  k.name = "softmax";
  k.dims = {SymInt::constant(rows), SymInt::constant(cols)};
  const int ix = k.input(DType::f32, k.contiguous_strides(), "x");
  const int iy = k.output(DType::f32, k.contiguous_strides(), "y");
  const int lx = k.load(ix);
  const int e = k.unary(Op::Exp, k.binary(Op::Sub, lx, k.reduce(Op::ReduceMax, lx)));
  k.store(iy, k.binary(Op::Div, e, k.reduce(Op::ReduceSum, e)));
  return k;
}

TEST(AutotuneCandidates, KernelKeysIgnoreNamesAndSeparateShapes) {
  EXPECT_EQ(kernel_key(relu_spec(4, 64, "layer1_relu")), kernel_key(relu_spec(4, 64, "layer7_relu")));
  EXPECT_NE(kernel_key(relu_spec(4, 64, "relu")), kernel_key(relu_spec(4, 128, "relu")));
  EXPECT_NE(kernel_key(relu_spec(4, 64, "relu")), kernel_key(softmax_spec(4, 64)));
  EXPECT_EQ(kernel_key(relu_spec(4, 64, "relu")).rfind("kernel pointwise ", 0), 0u);
}

// --- on the GPU --------------------------------------------------------------------------------------------

CompileOptions tuning_options(const TempDir& dir, CompileMode mode = CompileMode::MaxAutotune) {
  CompileOptions o;
  o.cache_dir = dir.path();
  o.mode = mode;
  return o;
}

TEST(AutotuneCuda, KernelLaunchConfigsAreTimedOnceThenReadFromTheDatabase) {
  INGOT_REQUIRE_CUDA();
  TempDir dir("ingot-autotune-");
  const std::vector<KernelSpec> specs = {softmax_spec(64, 3000), relu_spec(512, 1024, "relu"),
                                         relu_spec(512, 1024, "same_relu_other_name")};
  std::vector<codegen::cuda::CudaKernel> kernels = codegen::testing::cuda_codegen().compile(specs);
  const std::vector<codegen::cuda::CudaKernel> heuristic = kernels;
  CompileStats st;
  CudaSession::start(tuning_options(dir), 0, st)->tune_kernels(specs, kernels);
  EXPECT_EQ(st.autotune.kernels_timed, 2) << "two distinct kernels";
  EXPECT_EQ(st.autotune.kernels_from_db, 0);
  EXPECT_GT(st.autotune.seconds, 0.0);
  EXPECT_EQ(encode_config(kernels[1].config), encode_config(kernels[2].config));
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/autotune/" + AutotuneDb::file_name(cuda_device_id(0))));

  // The tuned configs compute what the heuristic ones do.
  manual_seed(3);
  Tensor x = randn({64, 3000}, DType::f32, kGpu, 0.0, 4.0);
  Tensor y_tuned = empty({64, 3000}, DType::f32, kGpu), y_heur = empty({64, 3000}, DType::f32, kGpu);
  codegen::testing::run_cuda(kernels[0], {x, y_tuned});
  codegen::testing::run_cuda(heuristic[0], {x, y_heur});
  EXPECT_LT(ingot::testing::rel_norm_error(y_tuned.to(Device::cpu()), y_heur.to(Device::cpu())), 1e-6);
  Tensor r = randn({512, 1024}, DType::f32, kGpu);
  Tensor r_tuned = empty({512, 1024}, DType::f32, kGpu), r_heur = empty({512, 1024}, DType::f32, kGpu);
  codegen::testing::run_cuda(kernels[1], {r, r_tuned});
  codegen::testing::run_cuda(heuristic[1], {r, r_heur});
  EXPECT_EQ(ingot::testing::count_unequal(r_tuned.to(Device::cpu()), r_heur.to(Device::cpu())), 0);

  // A second session (a later compile) reads every config and times nothing.
  std::vector<codegen::cuda::CudaKernel> again = heuristic;
  CompileStats st2;
  CudaSession::start(tuning_options(dir), 0, st2)->tune_kernels(specs, again);
  EXPECT_EQ(st2.autotune.kernels_timed, 0);
  EXPECT_EQ(st2.autotune.kernels_from_db, 2);
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(encode_config(again[i].config), encode_config(kernels[i].config));

  // No budget: the heuristic configs stay.
  TempDir other("ingot-autotune-");
  CompileOptions none = tuning_options(other);
  none.autotune_budget_s = 0;
  std::vector<codegen::cuda::CudaKernel> untouched = heuristic;
  CompileStats st3;
  CudaSession::start(none, 0, st3)->tune_kernels(specs, untouched);
  EXPECT_EQ(st3.autotune.kernels_timed, 0);
  EXPECT_EQ(st3.autotune.kernels_untuned, 2);
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(encode_config(untouched[i].config), encode_config(heuristic[i].config));
}

// Records what matmul.cu asks and reports; `known` plays the database.
class RecordingTuner : public kernels::cuda::MatmulTuner {
 public:
  std::optional<std::string> find(const std::string& sig) override {
    ++finds;
    auto it = known.find(sig);
    return it == known.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  bool may_time() override { return allow; }
  void chose(const std::string& sig, const std::string& algo, double, double, int n) override {
    ++chosen;
    candidates = n;
    known[sig] = algo;
  }
  std::map<std::string, std::string> known;
  bool allow = true;
  int finds = 0, chosen = 0, candidates = 0;
};

TEST(AutotuneCuda, MatmulAlgorithmsAreTimedOnceAndMatchTheFirstHeuristic) {
  INGOT_REQUIRE_CUDA();
  namespace kg = kernels::cuda;
  manual_seed(11);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 1.5}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " beta " + std::to_string(beta));
      const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
      Tensor a = randn({2, 96, 200}, DType::f32, kGpu).to(dt), b = randn({2, 136, 200}, DType::f32, kGpu).to(dt);
      Tensor c0 = randn({2, 96, 136}, DType::f32, kGpu).to(dt);
      auto product = [&](kg::MatmulTuner* tuner) {
        Tensor out = c0.clone_raw();
        kg::MatmulTuningScope scope(tuner);
        kg::matmul(out, a, b, false, true, alpha, beta);
        return out.to(Device::cpu());
      };
      const Tensor heuristic = product(nullptr);

      RecordingTuner t;
      const Tensor tuned = product(&t);
      ASSERT_EQ(t.chosen, 1);
      ASSERT_EQ(t.known.size(), 1u);
      const std::string sig = t.known.begin()->first, algo = t.known.begin()->second;
      EXPECT_FALSE(algo.empty()) << sig;
      EXPECT_GE(t.candidates, 1);
      // beta != 0 reads the output: the timing runs wrote a scratch copy, so out was accumulated into once.
      EXPECT_LT(ingot::testing::rel_norm_error(tuned, heuristic), tol) << sig;

      const Tensor again = product(&t);  // known now: nothing timed
      EXPECT_EQ(t.chosen, 1);
      EXPECT_LT(ingot::testing::rel_norm_error(again, tuned), tol);

      RecordingTuner stale;  // a stored algorithm cuBLASLt cannot use: the first heuristic, as in default mode
      stale.known[sig] = "not-an-algorithm";
      EXPECT_EQ(ingot::testing::count_unequal(product(&stale), heuristic), 0);
      EXPECT_EQ(stale.chosen, 0);

      RecordingTuner spent;  // no budget left: the first heuristic, reported as untuned
      spent.allow = false;
      EXPECT_EQ(ingot::testing::count_unequal(product(&spent), heuristic), 0);
      EXPECT_EQ(spent.chosen, 1);
      EXPECT_EQ(spent.known[sig], "");
      EXPECT_EQ(spent.candidates, 0);
    }
  }
}

TEST(AutotuneCuda, Gpt2StepWithMaxAutotuneMatchesDefaultAndASecondCompileTimesNothing) {
  INGOT_REQUIRE_CUDA();
  TempDir plain("ingot-autotune-"), tuned_dir("ingot-autotune-");
  StepRun def = train_steps(ingot::testing::tiny_gpt2, true, 20, tuning_options(plain, CompileMode::Default), 2, 8, kGpu);
  StepRun tuned = train_steps(ingot::testing::tiny_gpt2, true, 20, tuning_options(tuned_dir), 2, 8, kGpu);
  ingot::testing::expect_same_training(def, tuned);
  EXPECT_EQ(def.stats.autotune.kernels_timed + def.stats.autotune.matmuls_timed, 0) << "default mode times nothing";
  const AutotuneStats& t = tuned.stats.autotune;
  EXPECT_GT(t.kernels_timed, 0);
  EXPECT_GT(t.matmuls_timed, 0);
  EXPECT_EQ(t.kernels_from_db + t.matmuls_from_db, 0) << "a fresh cache directory";
  EXPECT_GT(t.seconds, 0.0);
  std::printf("[ autotune ] kernels timed %lld (heuristic %lld), matmul signatures timed %lld, %.2f s\n",
              static_cast<long long>(t.kernels_timed), static_cast<long long>(t.kernels_untuned),
              static_cast<long long>(t.matmuls_timed), t.seconds);

  // A second compile with the same cache directory: every choice comes from the database.
  StepRun again = train_steps(ingot::testing::tiny_gpt2, true, 20, tuning_options(tuned_dir), 2, 8, kGpu);
  const AutotuneStats& a = again.stats.autotune;
  EXPECT_EQ(a.kernels_timed, 0);
  EXPECT_EQ(a.matmuls_timed, 0);
  EXPECT_EQ(a.kernels_from_db, t.kernels_timed);
  EXPECT_EQ(a.matmuls_from_db, t.matmuls_timed);
  ingot::testing::expect_same_training(tuned, again);
}

TEST(AutotuneCuda, ZeroBudgetKeepsDefaultModesChoices) {
  INGOT_REQUIRE_CUDA();
  TempDir plain("ingot-autotune-"), tuned_dir("ingot-autotune-");
  CompileOptions none = tuning_options(tuned_dir);
  none.autotune_budget_s = 0;
  StepRun def = train_steps(ingot::testing::tiny_gpt2, true, 5, tuning_options(plain, CompileMode::Default), 2, 8, kGpu);
  StepRun zero = train_steps(ingot::testing::tiny_gpt2, true, 5, none, 2, 8, kGpu);
  ingot::testing::expect_same_training(def, zero);
  EXPECT_EQ(zero.stats.autotune.kernels_timed + zero.stats.autotune.matmuls_timed, 0);
  EXPECT_GT(zero.stats.autotune.kernels_untuned, 0);
  EXPECT_GT(zero.stats.autotune.matmuls_untuned, 0);
  EXPECT_FALSE(std::filesystem::exists(tuned_dir.path() + "/autotune/" + AutotuneDb::file_name(cuda_device_id(0))))
      << "nothing measured, nothing written";
}

#endif

}  // namespace
}  // namespace ingot::autotune
