// opbridge CUDA: properties of the current device, for the launchers' choice of configuration.
// Plain C++ (CUDA runtime API only).
#pragma once

#include <cuda_runtime_api.h>

namespace opbridge::cuda {

struct DeviceInfo {
  int device = 0;    // ordinal
  int sm_count = 0;  // streaming multiprocessors
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
};

// Properties of the current device (cudaGetDevice), queried once per device and cached; a failed
// query is returned and retried on the next call.
cudaError_t current_device_info(DeviceInfo* out);

}  // namespace opbridge::cuda
