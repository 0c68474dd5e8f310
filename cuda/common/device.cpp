// opbridge::cuda::current_device_info: device properties, queried once per device.
#include <atomic>
#include <mutex>

#include "common/device.h"

namespace opbridge::cuda {
namespace {

// Devices with a larger ordinal are queried on every call instead of cached.
constexpr int kMaxCachedDevices = 64;

// A failed query is not cached (the next call retries); a successful one is published once.
struct Slot {
  std::atomic<bool> ready{false};
  DeviceInfo info;
};

cudaError_t query(int device, DeviceInfo* out) {
  DeviceInfo info;
  info.device = device;
  cudaError_t e = cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e == cudaSuccess) *out = info;
  return e;
}

}  // namespace

cudaError_t current_device_info(DeviceInfo* out) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  if (device < 0 || device >= kMaxCachedDevices) return query(device, out);
  static Slot slots[kMaxCachedDevices];
  static std::mutex mu;
  Slot& s = slots[device];
  if (!s.ready.load(std::memory_order_acquire)) {
    DeviceInfo info;
    e = query(device, &info);
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ready.load(std::memory_order_relaxed)) {
      s.info = info;
      s.ready.store(true, std::memory_order_release);
    }
  }
  *out = s.info;
  return cudaSuccess;
}

}  // namespace opbridge::cuda
