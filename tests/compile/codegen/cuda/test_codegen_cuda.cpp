// CUDA code generation: rendering and NVRTC for every kernel kind (no GPU needed), NVRTC errors, and
// pointwise kernels on the GPU against the eager CPU ops for contiguous, broadcast, transposed, misaligned
// and odd-sized inputs in f32, bf16, f16 and f64 (vector and scalar paths).
#include <gtest/gtest.h>

#include "runtime/cuda_runtime.h"
#include "tests/compile/codegen/test_codegen_cuda_util.h"

namespace ingot::codegen {
namespace {

#ifndef INGOT_WITH_CUDA_CODEGEN
TEST(CodegenCuda, NeedsACudaBuild) {
  INGOT_REQUIRE_CUDA();
  GTEST_SKIP() << "built without the CUDA code generator (INGOT_CUDA=OFF)";
}
#else

using namespace ingot::codegen::testing;
constexpr DType kDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

std::vector<SymInt> c(std::initializer_list<int64_t> v) {
  std::vector<SymInt> out;
  for (int64_t x : v) out.push_back(SymInt::constant(x));
  return out;
}

// out = x * b + tanh(y), b broadcast along rows.
KernelSpec pointwise_spec(DType dt, const Shape& shape, std::vector<SymInt> x_strides) {
  KernelSpec k;
  k.name = "mul_add_tanh";
  k.dims = dims_of(shape);
  const int ix = k.input(dt, std::move(x_strides), "x");
  const int ib = k.input(dt, {SymInt::constant(0), SymInt::constant(1)}, "b");
  const int iy = k.input(dt, k.contiguous_strides(), "y");
  const int io = k.output(dt, k.contiguous_strides(), "out");
  k.store(io, k.binary(Op::Add, k.binary(Op::Mul, k.load(ix), k.load(ib)), k.unary(Op::Tanh, k.load(iy))));
  return k;
}

// The same kernel with every size and stride a run-time sym: [s0, s1], x strides [s2, 1].
KernelSpec symbolic_spec(DType dt) {
  KernelSpec k;
  k.name = "sym_scale_gelu";
  k.num_syms = 3;
  k.dims = {SymInt::slot(0), SymInt::slot(1)};
  const int ix = k.input(dt, {SymInt::slot(2), SymInt::constant(1)}, "x");
  const int io = k.output(dt, {SymInt::slot(1), SymInt::constant(1)}, "out");
  k.store(io, k.unary(Op::GeluTanh, k.binary(Op::Mul, k.load(ix), k.scalar(0, dt))));
  return k;
}

KernelSpec softmax_spec(DType dt, const Shape& shape) {
  KernelSpec k;
  k.kind = KernelKind::RowReduction;
  k.name = "softmax";
  k.dims = dims_of(shape);
  const int ix = k.input(dt, k.contiguous_strides(), "x");
  const int iy = k.output(dt, k.contiguous_strides(), "y");
  const int lx = k.load(ix);
  const int e = k.unary(Op::Exp, k.binary(Op::Sub, lx, k.reduce(Op::ReduceMax, lx)));
  k.store(iy, k.binary(Op::Div, e, k.reduce(Op::ReduceSum, e)));
  return k;
}

KernelSpec scale_all_spec(DType dt) {
  KernelSpec k;
  k.kind = KernelKind::MultiTensor;
  k.name = "scale_all";
  const int ip = k.input(dt, {}, "p");
  const int io = k.output(dt, {}, "p", ip);
  k.store(io, k.binary(Op::Mul, k.load(ip), k.scalar(0, dt)));
  return k;
}

// Every op whose formula is runtime/kernels/scalar_math.h's (Note [Scalar math written once]), summed.
KernelSpec activations_spec(DType dt) {
  KernelSpec k;
  k.name = "activations";
  k.dims = dims_of({4, 8});
  const int x = k.load(k.input(dt, k.contiguous_strides(), "x"));
  const int dy = k.load(k.input(dt, k.contiguous_strides(), "dy"));
  int acc = k.unary(Op::GeluTanh, x);
  for (Op op : {Op::GeluErf, Op::Silu, Op::Sigmoid, Op::Relu}) acc = k.binary(Op::Add, acc, k.unary(op, x));
  for (Op op : {Op::GeluTanhGrad, Op::GeluErfGrad, Op::SiluGrad, Op::SigmoidGrad, Op::TanhGrad, Op::ReluGrad})
    acc = k.binary(Op::Add, acc, k.binary(op, x, dy));
  k.store(k.output(dt, k.contiguous_strides(), "y"), acc);
  return k;
}

TEST(CodegenCuda, GeneratedSourceIncludesTheScalarMathHeaderInsteadOfRestatingFormulas) {
  EXPECT_NE(cuda::render_preamble().find("#include \"ingot_scalar_math.h\""), std::string::npos);
  const std::string src = cuda::render_kernel(activations_spec(DType::bf16), "activations_0").source;
  for (const char* call : {"ig_math::gelu_tanh<float>(", "ig_math::gelu_erf<float>(", "ig_math::silu<float>(",
                           "ig_math::sigmoid<float>(", "ig_math::relu<float>(", "ig_math::gelu_tanh_grad<float>(",
                           "ig_math::gelu_erf_grad<float>(", "ig_math::silu_grad<float>(",
                           "ig_math::sigmoid_grad<float>(", "ig_math::tanh_grad<float>(", "ig_math::relu_grad<float>("})
    EXPECT_NE(src.find(call), std::string::npos) << call << " missing from\n" << src;
  for (const char* formula : {"0.797884", "0.044715", "0.707106", "0.398942", "exp", "tanh(", "erf("})
    EXPECT_EQ(src.find(formula), std::string::npos) << formula << " restated in\n" << src;
}

TEST(CodegenCuda, EveryKindRendersAndCompilesWithNvrtcWithoutAGpu) {
  const int arch = cuda_available() ? cuda::device_arch(0) : 90;
  std::vector<KernelSpec> specs;
  std::vector<int> widths;
  for (DType dt : kDTypes) {
    const int w = static_cast<int>(std::min<size_t>(8, 16 / itemsize(dt)));
    specs.push_back(pointwise_spec(dt, {6, 64}, c({64, 1})));
    widths.push_back(w);
    specs.push_back(pointwise_spec(dt, {6, 64}, c({1, 6})));  // transposed: no vector path
    widths.push_back(1);
    specs.push_back(pointwise_spec(dt, {6, 63}, c({63, 1})));  // odd row length: no vector path
    widths.push_back(1);
    specs.push_back(symbolic_spec(dt));  // decided at run time
    widths.push_back(w);
    specs.push_back(softmax_spec(dt, {3, 128}));
    widths.push_back(w);
    specs.push_back(scale_all_spec(dt));
    widths.push_back(w);
  }
  {  // integers: math through double, integer pow and division, comparisons against an index
    KernelSpec k;
    k.name = "int_math";
    k.dims = dims_of({5, 3});
    const int ix = k.load(k.input(DType::i64, k.contiguous_strides(), "x"));
    const int iy = k.load(k.input(DType::i32, k.contiguous_strides(), "y"));
    const int p = k.binary(Op::Add, k.binary(Op::Pow, ix, iy), k.binary(Op::Div, ix, k.unary(Op::Abs, iy)));
    k.store(k.output(DType::i64, k.contiguous_strides(), "p"), k.binary(Op::Max, p, k.unary(Op::Exp, iy)));
    k.store(k.output(DType::b8, k.contiguous_strides(), "lt"), k.binary(Op::Lt, k.index(1), ix));
    specs.push_back(k);
    widths.push_back(1);  // 5 * 3 elements: no multiple of the width
  }
  for (DType dt : {DType::f32, DType::f64}) {  // NVRTC compiles scalar_math.h's functions in both types
    specs.push_back(activations_spec(dt));
    widths.push_back(static_cast<int>(std::min<size_t>(8, 16 / itemsize(dt))));
  }
  // One program per dtype (six kernels each) plus the integer one, compiled side by side as CudaCodegen does.
  std::vector<cuda::NvrtcProgram> programs;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (i % 6 == 0) programs.push_back({"every_kind_" + std::to_string(i / 6) + ".cu", cuda::render_preamble()});
    const cuda::RenderedKernel r = cuda::render_kernel(specs[i], specs[i].symbol());
    EXPECT_EQ(r.abi.vector_width, widths[i]) << specs[i].name << " #" << i << "\n" << r.source;
    EXPECT_EQ(r.abi.functions.size(), specs[i].kind == KernelKind::RowReduction ? 3u : 1u);
    programs.back().source += "\n" + r.source;
  }
  int finished = 0;
  const std::vector<std::string> cubins = cuda::compile_cubins(programs, arch, 4, [&](size_t) { ++finished; });
  ASSERT_EQ(cubins.size(), programs.size());
  EXPECT_EQ(finished, static_cast<int>(programs.size()));
  for (const std::string& cubin : cubins) {
    EXPECT_GT(cubin.size(), 1000u);
    EXPECT_EQ(cubin.substr(1, 3), "ELF") << "a cubin is an ELF image";
  }
}

TEST(CodegenCuda, NvrtcFailuresQuoteTheLogAndTheOffendingSourceLine) {
  const std::string bad = "// line 1\nextern \"C\" __global__ void f(float* y) {\n  y[0] = no_such_function(1.0f);\n}\n";
  const std::string msg = ::ingot::testing::error_of([&] { cuda::compile_cubins({{"bad_kernel.cu", bad}}, 90, 1); });
  EXPECT_NE(msg.find("NVRTC could not compile"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no_such_function"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad_kernel.cu:3:   y[0] = no_such_function(1.0f);"), std::string::npos) << msg;
}

TEST(CodegenCuda, AnInvalidSpecIsRejectedWithTheKernelName) {
  KernelSpec k = pointwise_spec(DType::f32, {4, 8}, c({8, 1}));
  k.name = "broken_kernel";
  k.stores[0].buffer = 0;  // an input
  const std::string msg = ::ingot::testing::error_of([&] { cuda::render_kernel(k, "x"); });
  EXPECT_NE(msg.find("broken_kernel"), std::string::npos) << msg;
}

TEST(CodegenCuda, PointwiseMatchesEagerForContiguousBroadcastAndTransposedInputs) {
  INGOT_REQUIRE_CUDA();
  const Shape shape = {37, 64};
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes) {
    specs.push_back(pointwise_spec(dt, shape, c({64, 1})));
    specs.push_back(pointwise_spec(dt, shape, c({1, 37})));
  }
  const auto kernels = cuda_codegen().compile(specs);
  cuda::LaunchConfig scalar;
  scalar.vectorize = false;
  for (size_t d = 0; d < 4; ++d) {
    const DType dt = kDTypes[d];
    SCOPED_TRACE(dtype_name(dt));
    Both x = both(randn(shape, DType::f64).to(dt));
    Both xt = both(randn({64, 37}, DType::f64).to(dt), [](const Tensor& t) { return transpose(t, 0, 1); });
    Both b = both(randn({64}, DType::f64).to(dt));
    Both y = both(randn(shape, DType::f64).to(dt));
    for (int layout = 0; layout < 2; ++layout) {
      const Both& in = layout == 0 ? x : xt;
      const Tensor x64 = in.cpu.to(DType::f64), b64 = b.cpu.to(DType::f64).expand_raw(shape);
      const Tensor want = add(mul(x64, b64), tanh(y.cpu.to(DType::f64)));  // f64 on the same inputs
      for (const cuda::LaunchConfig* cfg : std::vector<const cuda::LaunchConfig*>{nullptr, &scalar}) {
        Tensor out = zeros(shape, dt, kGpu);
        run_cuda(kernels[2 * d + layout], {in.gpu, b.gpu.expand_raw(shape), y.gpu, out}, {}, {}, cfg);
        EXPECT_TENSOR_CLOSE(host(out), want, dt);
      }
    }
  }
}

TEST(CodegenCuda, MisalignedViewsAndOddRunTimeSizesTakeTheScalarPath) {
  INGOT_REQUIRE_CUDA();
  std::vector<KernelSpec> specs;
  for (DType dt : kDTypes) specs.push_back(symbolic_spec(dt));
  const auto kernels = cuda_codegen().compile(specs);
  for (size_t d = 0; d < 4; ++d) {
    const DType dt = kDTypes[d];
    SCOPED_TRACE(dtype_name(dt));
    // [rows, cols] views of a flat buffer at element offset `off` with row stride `ld`: offset 1 misaligns
    // every vector access, cols 7 is no multiple of any width, ld 9 breaks the row alignment.
    struct Case {
      int64_t rows, cols, ld, off;
    };
    for (const Case& cs : {Case{5, 16, 16, 0}, Case{5, 16, 16, 1}, Case{3, 7, 7, 0}, Case{4, 16, 24, 0},
                           Case{4, 8, 9, 0}, Case{1, 1, 1, 3}}) {
      SCOPED_TRACE("rows " + std::to_string(cs.rows) + " cols " + std::to_string(cs.cols) + " ld " +
                   std::to_string(cs.ld) + " offset " + std::to_string(cs.off));
      const int64_t n = cs.off + cs.rows * cs.ld;
      Both x = both(randn({n}, DType::f64).to(dt),
                    [&](const Tensor& t) { return t.as_strided({cs.rows, cs.cols}, {cs.ld, 1}, cs.off); });
      const double scale = 0.75;
      const Tensor want = gelu(mul(x.cpu.to(DType::f64), scale), true).to(dt);
      Tensor out = zeros({cs.rows, cs.cols}, dt, kGpu);
      run_cuda(kernels[d], {x.gpu, out}, {cs.rows, cs.cols, cs.ld}, {scale});
      EXPECT_TENSOR_CLOSE(host(out), want, dt);
    }
  }
}

TEST(CodegenCuda, IdenticalKernelsCompileOnceAndAnEmptyLaunchIsANoOp) {
  INGOT_REQUIRE_CUDA();
  cuda::CudaCodegen cg(cuda::CudaCodegenOptions{"", false, 2, {}});
  CodegenStats st;
  KernelSpec a = pointwise_spec(DType::f32, {3, 40}, c({40, 1}));
  KernelSpec b = a;
  b.name = "another_name";  // names are not part of the identity
  const auto kernels = cg.compile({a, b, softmax_spec(DType::f32, {2, 40})}, &st);
  EXPECT_EQ(st.compiled, 2);
  EXPECT_EQ(st.memory_hits, 1);
  EXPECT_EQ(st.compiler_processes, 2);
  EXPECT_EQ(kernels[0].symbol, kernels[1].symbol);
  CodegenStats again;
  cg.compile({a}, &again);
  EXPECT_EQ(again.compiled, 0);
  EXPECT_EQ(again.memory_hits, 1);
  // Zero rows of a symbolic kernel launch nothing (a zero-sized grid would be an error).
  const cuda::CudaKernel sym = cg.compile(symbolic_spec(DType::f32));
  Tensor x = randn({4}, DType::f32, kGpu), out = zeros({4}, DType::f32, kGpu);
  run_cuda(sym, {x, out}, {0, 4, 4}, {1.0});
  EXPECT_EQ(sum(abs(host(out))).item(), 0.0);
}

// A multi-tensor kernel launched to read its scalars from device memory (what a CUDA graph captures for the
// optimizer update, Note [Scalars read from the device]) computes what the launch passed the same scalars does,
// bit for bit, and a later launch sees what the buffer holds then.
TEST(CodegenCuda, MultiTensorKernelReadsItsScalarsFromDeviceMemory) {
  INGOT_REQUIRE_CUDA();
  const auto kernels = cuda_codegen().compile({scale_all_spec(DType::f32), scale_all_spec(DType::bf16)});
  for (size_t d = 0; d < 2; ++d) {
    const DType dt = d == 0 ? DType::f32 : DType::bf16;
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<int64_t> sizes = {1000, 33, 70001};  // several chunks, and an odd tail
    std::vector<Tensor> in, by_arg, by_device;
    std::vector<void*> arg_bufs, device_bufs;
    std::vector<int64_t> syms{static_cast<int64_t>(sizes.size())};
    for (int64_t n : sizes) {
      in.push_back(randn({n}, DType::f64).to(dt).to(kGpu));
      by_arg.push_back(zeros({n}, dt, kGpu));
      by_device.push_back(zeros({n}, dt, kGpu));
      arg_bufs.insert(arg_bufs.end(), {in.back().data_ptr(), by_arg.back().data_ptr()});
      device_bufs.insert(device_bufs.end(), {in.back().data_ptr(), by_device.back().data_ptr()});
      syms.push_back(n);
    }
    const double scale = 0.7371;
    Tensor scalars = full({1}, scale, DType::f64).to(kGpu);
    kernels[d](arg_bufs.data(), syms.data(), &scale);
    kernels[d].launch_reading_device_scalars(device_bufs.data(), syms.data(),
                                             static_cast<const double*>(scalars.data_ptr()));
    for (size_t t = 0; t < sizes.size(); ++t) {
      const Tensor diff = sub(host(by_device[t]).to(DType::f64), host(by_arg[t]).to(DType::f64));
      EXPECT_EQ(sum(abs(diff)).item(), 0.0) << "tensor " << t << ": not bit-equal to the launch passed the scalar";
      EXPECT_TENSOR_CLOSE(host(by_arg[t]), mul(host(in[t]).to(DType::f64), scale).to(dt), dt);
    }
    scalars.copy_(full({1}, -2.0, DType::f64));  // the same launch reads the new value
    kernels[d].launch_reading_device_scalars(device_bufs.data(), syms.data(),
                                             static_cast<const double*>(scalars.data_ptr()));
    for (size_t t = 0; t < sizes.size(); ++t)
      EXPECT_TENSOR_CLOSE(host(by_device[t]), mul(host(in[t]).to(DType::f64), -2.0).to(dt), dt);
  }
}

// A CUDA graph that captured a multi-tensor launch replays it correctly after later launches of the same kernel
// uploaded enough distinct tables (fresh output buffers each time) to flush the uploaded ones: the captured
// launch's table is pinned (Note [Tables of captured launches]).
TEST(CodegenCuda, ACapturedMultiTensorLaunchSurvivesTheTableFlush) {
  INGOT_REQUIRE_CUDA();
  const cuda::CudaKernel k = cuda_codegen().compile(scale_all_spec(DType::f32));
  Tensor in = randn({5000}, DType::f64).to(DType::f32).to(kGpu);
  Tensor out = zeros({5000}, DType::f32, kGpu);
  std::vector<int64_t> syms{1, 5000};
  const double scale = 3.0;
  ingot::cuda::Stream s = ingot::cuda::create_stream(0);
  ingot::cuda::synchronize_device(0);
  {
    void* bufs[] = {in.data_ptr(), out.data_ptr()};
    ingot::cuda::begin_capture(s);
    k.launch(bufs, syms.data(), &scale, k.config, s.handle);
    void* exec = ingot::cuda::end_capture(s);
    // Launches with distinct outputs: more distinct tables than the kernel keeps, so the others are flushed.
    std::vector<Tensor> others;
    for (size_t i = 0; i < cuda::multi_tensor_table_limit() + 36; ++i) {
      others.push_back(zeros({5000}, DType::f32, kGpu));
      void* other_bufs[] = {in.data_ptr(), others.back().data_ptr()};
      const double other_scale = -1.0;
      k(other_bufs, syms.data(), &other_scale);
    }
    ingot::cuda::synchronize_device(0);
    others.clear();
    // Memory the flushed tables lived in may be handed out again: fill some with garbage first.
    std::vector<Tensor> junk;
    for (int i = 0; i < 8; ++i) junk.push_back(full({1 << 16}, -7.0, DType::f64, kGpu));
    ingot::cuda::launch_graph(exec, s);
    ingot::cuda::synchronize_stream(s);
    ingot::cuda::destroy_graph(exec);
  }
  ingot::cuda::destroy_stream(s);
  EXPECT_TENSOR_CLOSE(host(out), mul(host(in).to(DType::f64), scale).to(DType::f32), DType::f32);
}

// Note [Multi-tensor chunks]: no GPU needed, the launch's arithmetic only.
TEST(CodegenCuda, MultiTensorChunksLeaveNoRoundOfAFewWholeChunks) {
  using cuda::multi_tensor_chunk;
  const int64_t sms = 132, resident = 4 * sms;  // an H200 holding four 256-thread blocks of the AdamW update per SM
  const int64_t grid = 4 * 8 * sms;              // the launcher's grid: four blocks per SM in each of 8 waves
  const int block = 256, v = 8;
  const auto chunks_of = [](const std::vector<int64_t>& sizes, int64_t chunk) {
    int64_t n = 0;
    for (int64_t s : sizes) n += (s + chunk - 1) / chunk;
    return n;
  };
  // A ~150 MB bucket of the ~1B Llama's f32 gradients (the MLP's and attention's weights of one layer, norms):
  // 64K chunks would make ~570, a round of 42 whole chunks after the 528 the GPU holds.
  const std::vector<int64_t> bucket = {8192 * 2048, 2048 * 8192, 2048 * 2048, 512 * 2048, 512 * 2048, 2048, 2048};
  ASSERT_LT(chunks_of(bucket, 65536), 2 * resident);
  const int64_t chunk = multi_tensor_chunk(bucket, sms, resident, grid, block, v, 65536);
  EXPECT_EQ(chunk % v, 0);
  EXPECT_GE(chunks_of(bucket, chunk), 4 * grid - 8) << chunk;
  EXPECT_GE(chunk, 8 * block);
  // GPT-2's whole update (~124M elements in 148 tensors) and the ~1B Llama's keep 64K chunks: rounds to spare.
  std::vector<int64_t> gpt2 = {50257 * 768, 1024 * 768};
  for (int l = 0; l < 12; ++l)
    for (int64_t n : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768})
      gpt2.push_back(n);
  EXPECT_EQ(multi_tensor_chunk(gpt2, sms, resident, grid, block, v, 65536), 65536);
  std::vector<int64_t> llama = {128256 * 2048};
  for (int l = 0; l < 16; ++l) llama.insert(llama.end(), bucket.begin(), bucket.end());
  EXPECT_EQ(multi_tensor_chunk(llama, sms, resident, grid, block, v, 65536), 65536);
  // A short list (adapters, norms): chunks of 8 elements per thread, one round.
  const std::vector<int64_t> adapters(64, 14336);
  EXPECT_EQ(multi_tensor_chunk(adapters, sms, resident, grid, block, v, 65536), 8 * block);
  // max-autotune's configured chunk bounds it; the width rounds it up.
  EXPECT_EQ(multi_tensor_chunk(gpt2, sms, resident, grid, block, v, 4096), 4096);
  EXPECT_EQ(multi_tensor_chunk(gpt2, sms, resident, grid, block, 3, 4000), 4002);
}

#endif

}  // namespace
}  // namespace ingot::codegen
