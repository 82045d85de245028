// Note [SM carve-out] (sm_budget.h): the process-wide carve-out and the SM counts derived from it.
#include "runtime/sm_budget.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <mutex>

#include "runtime/error.h"

namespace ingot {
namespace {

constexpr const char* kEnv = "INGOT_SM_CARVEOUT";

// Kernel launches read the carve-out: `known` holds it once resolved (-1 before), so they take no lock.
struct CarveoutState {
  std::mutex mu;
  std::atomic<int> known{-1};
  std::string source;  // guarded by mu
};

CarveoutState& state() {
  static CarveoutState s;
  return s;
}

}  // namespace

int parse_sm_carveout(const std::string& text, const std::string& source) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  INGOT_CHECK(!text.empty() && *end == '\0' && errno == 0 && v >= 0 && v <= INT_MAX, source, "='", text,
              "': expected an SM carve-out, an integer >= 0 (the SMs left to communication kernels)");
  return static_cast<int>(v);
}

void set_sm_carveout(int sms, const std::string& source) {
  INGOT_CHECK(sms >= 0, source, "=", sms, ": expected an SM carve-out >= 0 (the SMs left to communication kernels)");
  CarveoutState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.source = sms > 0 ? source : "";
  s.known.store(sms);
}

int sm_carveout() {
  CarveoutState& s = state();
  if (const int v = s.known.load(std::memory_order_relaxed); v >= 0) return v;
  std::lock_guard<std::mutex> lock(s.mu);
  if (const int v = s.known.load(); v >= 0) return v;
  int v = 0;
  if (const char* env = std::getenv(kEnv); env && *env) v = parse_sm_carveout(env, kEnv);  // throws: stays unknown
  s.source = v > 0 ? kEnv : "";
  s.known.store(v);
  return v;
}

std::string sm_carveout_source() {
  sm_carveout();
  CarveoutState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.source;
}

int sms_left(int total_sms) {
  const int n = sm_carveout();
  if (n == 0) return total_sms;
  INGOT_CHECK(n < total_sms, sm_carveout_source(), "=", n,
              ": an SM carve-out must leave SMs to compute on, but this GPU has ", total_sms,
              " (expected 0 <= carve-out < ", total_sms, ")");
  return total_sms - n;
}

int usable_sms(int device) { return sms_left(cuda::multiprocessor_count(device)); }

int sm_count_target(int total_sms) { return sm_carveout() == 0 ? 0 : sms_left(total_sms); }

std::string sm_budget_key(int total_sms) {
  return sm_carveout() == 0 ? std::string() : " sm_target " + std::to_string(sms_left(total_sms));
}

SmCarveoutScope::SmCarveoutScope(int sms, const std::string& source)
    : previous_(sm_carveout()), previous_source_(sm_carveout_source()) {
  set_sm_carveout(sms, source);
}

SmCarveoutScope::~SmCarveoutScope() { set_sm_carveout(previous_, previous_source_); }

}  // namespace ingot
