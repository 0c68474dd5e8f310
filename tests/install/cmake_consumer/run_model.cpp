// opbridge_run: runs an ONNX model with ONNX Runtime's C++ API and opbridge's custom ops.
//
//   opbridge_run [--library <custom-op library>]... [--linked] [--cuda] <model.onnx> <out_dir> <input.npy>...
//
// Inputs are bound to the model's inputs in order; output i is written to <out_dir>/<i>.npy.
//   --library <path>  register a custom-op library by path (RegisterCustomOpsLibrary_V2)
//   --linked          register the ops of the library this program is linked with (opbridge::ort)
//                     by calling its RegisterCustomOps (only in opbridge_run_linked)
//   --cuda            run on the CUDA execution provider, with CPU fallback disabled, so that the
//                     session fails unless every node (our custom ops included) has a CUDA kernel
// Exit status 0 on success; 1 with the error on stderr otherwise (ORT errors included).
// ORT_API_MANUAL_INIT (CMakeLists.txt, every TU): the API table is chosen in main().
#include <onnxruntime_cxx_api.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "npy.h"
#include "register.h"

namespace {

struct TypeInfo {
  const char* descr;
  ONNXTensorElementDataType onnx;
  size_t size;
};

constexpr TypeInfo kTypes[] = {
    {"<f4", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 4},   {"<f8", ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, 8},
    {"<f2", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, 2}, {"<i8", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 8},
    {"<i4", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 4},   {"|b1", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, 1},
};

const TypeInfo& by_descr(const std::string& d) {
  for (const auto& t : kTypes) {
    if (d == t.descr) return t;
  }
  throw std::runtime_error("unsupported input dtype " + d);
}

const TypeInfo& by_onnx(ONNXTensorElementDataType e) {
  for (const auto& t : kTypes) {
    if (e == t.onnx) return t;
  }
  throw std::runtime_error("unsupported output element type " + std::to_string(static_cast<int>(e)));
}

int usage() {
  std::fprintf(stderr,
               "usage: opbridge_run [--library <path>]... [--linked] [--cuda] <model.onnx> <out_dir> "
               "<input.npy>...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> libraries, positional;
  bool linked = false, cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--library" && i + 1 < argc) {
      libraries.push_back(argv[++i]);
    } else if (a == "--linked") {
      linked = true;
    } else if (a == "--cuda") {
      cuda = true;
    } else if (a.rfind("--", 0) == 0) {
      return usage();
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() < 2) return usage();

  // The C++ wrappers use the API table of the headers they come from (opbridge's); a runtime older
  // than those headers does not have it, so say so instead of crashing.
  const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    std::fprintf(stderr, "error: ONNX Runtime %s lacks C API %d (built against newer headers)\n",
                 OrtGetApiBase()->GetVersionString(), ORT_API_VERSION);
    return 1;
  }
  Ort::InitApi(api);

  try {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "opbridge_run");
    Ort::SessionOptions so;
    for (const auto& lib : libraries) so.RegisterCustomOpsLibrary(lib.c_str());
    if (linked && !register_linked_ops(so)) {
      std::fprintf(stderr, "error: --linked: this program is not linked with a custom-op library\n");
      return 1;
    }
    if (cuda) {
      OrtCUDAProviderOptions cuda_options{};
      so.AppendExecutionProvider_CUDA(cuda_options);
      so.AddConfigEntry("session.disable_cpu_ep_fallback", "1");
    }
    Ort::Session session(env, positional[0].c_str(), so);

    const size_t n_in = session.GetInputCount();
    if (positional.size() - 2 != n_in) {
      throw std::runtime_error("the model has " + std::to_string(n_in) + " inputs, got " +
                               std::to_string(positional.size() - 2) + " .npy files");
    }
    Ort::AllocatorWithDefaultOptions alloc;
    std::vector<Ort::AllocatedStringPtr> name_holders;
    std::vector<const char*> in_names, out_names;
    std::vector<npy::Array> arrays;
    std::vector<Ort::Value> inputs;
    const auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    arrays.reserve(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      name_holders.push_back(session.GetInputNameAllocated(i, alloc));
      in_names.push_back(name_holders.back().get());
      arrays.push_back(npy::read(positional[i + 2]));
      npy::Array& a = arrays.back();
      inputs.push_back(Ort::Value::CreateTensor(mem, a.data.data(), a.data.size(), a.shape.data(), a.shape.size(),
                                                by_descr(a.descr).onnx));
    }
    const size_t n_out = session.GetOutputCount();
    for (size_t i = 0; i < n_out; ++i) {
      name_holders.push_back(session.GetOutputNameAllocated(i, alloc));
      out_names.push_back(name_holders.back().get());
    }

    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), n_in, out_names.data(), n_out);
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto info = outputs[i].GetTensorTypeAndShapeInfo();
      const TypeInfo& t = by_onnx(info.GetElementType());
      const std::vector<int64_t> shape = info.GetShape();
      const size_t bytes = info.GetElementCount() * t.size;
      npy::write(positional[1] + "/" + std::to_string(i) + ".npy", t.descr, shape,
                 outputs[i].GetTensorRawData(), bytes);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
