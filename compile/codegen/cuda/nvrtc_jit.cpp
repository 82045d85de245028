// NVRTC compilation of generated CUDA sources (see nvrtc_jit.h).
#include "compile/codegen/cuda/nvrtc_jit.h"

#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "compile/codegen/common/scalar_math.h"
#include "runtime/error.h"

namespace ingot::codegen::cuda {

namespace {

void check_nvrtc(nvrtcResult r, const char* what, const std::string& program) {
  INGOT_CHECK(r == NVRTC_SUCCESS, "[codegen] NVRTC ", what, " failed for '", program, "': ", nvrtcGetErrorString(r));
}

// NVRTC's log with, after it, each line it points at ("name(123): error: ...") quoted from the source.
std::string explain_log(const NvrtcProgram& prog, const std::string& log) {
  std::vector<std::string> lines;
  {
    std::istringstream in(prog.source);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  std::ostringstream out;
  out << log;
  const std::regex where(R"(\((\d+)\): (error|warning))");
  int quoted = 0;
  std::istringstream in(log);
  for (std::string l; std::getline(in, l) && quoted < 8;) {
    std::smatch m;
    if (!std::regex_search(l, m, where) || m[2] != "error") continue;
    const size_t n = std::stoul(m[1]);
    if (n == 0 || n > lines.size()) continue;
    out << "\n  " << prog.name << ":" << n << ": " << lines[n - 1];
    ++quoted;
  }
  return out.str();
}

std::string compile_one(const NvrtcProgram& prog, int arch) {
  nvrtcProgram p = nullptr;
  // The one header generated sources include (Note [Scalar math written once], runtime/kernels/scalar_math.h).
  const char* header = scalar_math_source().c_str();
  const char* header_name = kScalarMathHeader;
  check_nvrtc(nvrtcCreateProgram(&p, prog.source.c_str(), prog.name.c_str(), 1, &header, &header_name), "create",
              prog.name);
  struct Guard {
    nvrtcProgram* p;
    ~Guard() { nvrtcDestroyProgram(p); }
  } guard{&p};
  const std::vector<std::string> opts = nvrtc_options(arch);
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(p, static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    std::string log(n, '\0');
    if (n) nvrtcGetProgramLog(p, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    INGOT_FAIL("[codegen] NVRTC could not compile generated CUDA '", prog.name, "' for sm_", arch, " (",
               nvrtcGetErrorString(r), "):\n", explain_log(prog, log));
  }
  size_t n = 0;
  check_nvrtc(nvrtcGetCUBINSize(p, &n), "get cubin size", prog.name);
  std::string cubin(n, '\0');
  check_nvrtc(nvrtcGetCUBIN(p, cubin.data()), "get cubin", prog.name);
  return cubin;
}

}  // namespace

int device_arch(int device) {
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  INGOT_CHECK(e == cudaSuccess, "[codegen] cannot query the compute capability of cuda:", device, ": ",
              cudaGetErrorString(e));
  return major * 10 + minor;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> nvrtc_options(int arch) {
  return {"--gpu-architecture=sm_" + std::to_string(arch), "-default-device", "--std=c++17", "--fmad=true"};
}

std::vector<std::string> compile_cubins(const std::vector<NvrtcProgram>& programs, int arch, int max_parallel,
                                        const std::function<void(size_t)>& on_done) {
  std::vector<std::string> out(programs.size());
  std::mutex done_mu;
  std::vector<std::exception_ptr> errors(programs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < programs.size();) {
      try {
        out[i] = compile_one(programs[i], arch);
        if (on_done) {
          std::lock_guard<std::mutex> lock(done_mu);
          on_done(i);
        }
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(std::max(1, max_parallel), programs.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace ingot::codegen::cuda
