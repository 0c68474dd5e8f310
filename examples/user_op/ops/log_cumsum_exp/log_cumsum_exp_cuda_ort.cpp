// ORT CUDA op LogCumSumExp: the same declaration as the CPU op, for the CUDA execution
// provider, queued on ORT's compute stream.
#include <string>

#include <opbridge/ort/ort_op.h>

#include "log_cumsum_exp.cuh"

namespace userops {
namespace {

using namespace opbridge::ort;

void log_cumsum_exp_cuda_compute(const OrtOpContext& ctx) {
  const ScanDims d = log_cumsum_exp_dims(ctx.call);  // shapes on the host, data on the device
  const auto stream = static_cast<cudaStream_t>(ctx.io.gpu_stream());
  ctx.check(opbridge::dispatch<float, double>(ctx.call.in("x").type, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = launch_log_cumsum_exp<T>(stream, ctx.in("x").as<T>(), ctx.output_as<T>(0), d);
    return err == cudaSuccess ? opbridge::Status::Ok()
                              : opbridge::Status::RuntimeError(std::string("CUDA error: ") + cudaGetErrorString(err));
  }));
}

}  // namespace
}  // namespace userops

OPBRIDGE_ORT_OP(userops::log_cumsum_exp_decl, "CUDAExecutionProvider", userops::log_cumsum_exp_cuda_compute);
