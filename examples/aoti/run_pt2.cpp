// Runs an AOTInductor package (.pt2) whose graph calls opbridge's ops (or your own, made with
// `opbridge new-op`), with no Python in the process:
//
//   run_pt2 MODEL.pt2 INPUTS.bin OUTPUTS.bin [lib<ns>_torch.so ...]
//
// INPUTS.bin holds the inputs in order, OUTPUTS.bin gets the outputs: each tensor as int64 ndim,
// int64 dims[ndim], then its float32 values in row-major order (tests/deploy/test_aoti.py writes and
// reads them).
#include <cstdint>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <opbridge/torch/load_ops.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

namespace {

std::vector<at::Tensor> read_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<at::Tensor> out;
  int64_t ndim = 0;
  while (in.read(reinterpret_cast<char*>(&ndim), sizeof ndim)) {
    if (ndim < 0 || ndim > 16) throw std::runtime_error(path + ": bad tensor rank " + std::to_string(ndim));
    std::vector<int64_t> dims(static_cast<size_t>(ndim));
    in.read(reinterpret_cast<char*>(dims.data()), static_cast<std::streamsize>(ndim * sizeof(int64_t)));
    at::Tensor t = at::empty(dims, at::kFloat);
    in.read(reinterpret_cast<char*>(t.data_ptr<float>()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
    if (!in) throw std::runtime_error(path + ": truncated");
    out.push_back(t);
  }
  return out;
}

void write_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary);
  for (const at::Tensor& t0 : tensors) {
    const at::Tensor t = t0.to(at::kFloat).contiguous();
    const int64_t ndim = t.dim();
    out.write(reinterpret_cast<const char*>(&ndim), sizeof ndim);
    out.write(reinterpret_cast<const char*>(t.sizes().data()), static_cast<std::streamsize>(ndim * sizeof(int64_t)));
    out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt2 INPUTS.bin OUTPUTS.bin [op library ...]\n";
    return 2;
  }
  try {
    // First the op libraries: the package calls their ops by name through torch's dispatcher.
    opbridge::load_torch_ops(std::vector<std::string>(argv + 4, argv + argc));
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    write_tensors(argv[3], loader.run(read_tensors(argv[2])));
  } catch (const std::exception& e) {
    std::cerr << "run_pt2: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
