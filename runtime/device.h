// Where a tensor lives: the CPU or one CUDA device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ingot {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  static constexpr Device cpu() { return Device(DeviceType::cpu, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::cuda, i); }

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;  // "cpu", "cuda:0"
};

// Parses "cpu", "cuda", "cuda:N", and "auto" (cuda:0 when a GPU is present, else cpu); throws on anything else.
Device parse_device(std::string_view s);

// Number of CUDA devices usable by this process (0 when built without CUDA or when no GPU is present).
int cuda_device_count();
bool cuda_available();

}  // namespace ingot
