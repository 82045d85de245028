#include "runtime/device.h"

#include <charconv>

#include "runtime/error.h"

namespace ingot {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

bool cuda_available() { return cuda_device_count() > 0; }

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    int idx = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
    INGOT_CHECK(ec == std::errc() && p == rest.data() + rest.size() && idx >= 0, "invalid device '", s,
                "' (expected cpu, cuda, cuda:N or auto)");
    return Device::cuda(idx);
  }
  INGOT_FAIL("invalid device '", s, "' (expected cpu, cuda, cuda:N or auto)");
}

}  // namespace ingot
