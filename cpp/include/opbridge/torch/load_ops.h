// opbridge/torch/load_ops.h - registers opbridge's torch ops (and your op libraries) in a C++
// program that uses libtorch without Python, e.g. one that runs an AOTInductor package (.pt2)
// with torch::inductor::AOTIModelPackageLoader. A package calls custom ops by name through
// torch's dispatcher; it does not contain them, so their libraries must be loaded first.
//
//   #include <opbridge/torch/load_ops.h>
//   opbridge::load_torch_ops();                          // before the package is loaded
//   opbridge::load_torch_ops({"/path/libmyops_torch.so"});  // also your own op libraries
//
// CMake: target_link_libraries(app PRIVATE opbridge::torch_ops) (find_package(opbridge)) gives
// this header, the path of opbridge's library (OPBRIDGE_TORCH_OPS_LIBRARY) and libdl.
// `opbridge pt2 model.pt2 --libraries` prints the op libraries a package needs.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace opbridge {

// Loads (dlopen, RTLD_NOW | RTLD_GLOBAL) opbridge's torch op library, then each of `libraries`,
// then each path of the environment variable OPBRIDGE_TORCH_LIBRARIES (':'-separated). Loading
// a library registers its ops with torch's dispatcher; loading one twice is harmless.
//   libraries: paths of further op libraries (an `opbridge new-op` project's lib<ns>_torch.so)
// Throws std::runtime_error naming the library and the loader's reason when one does not load
// (for example a torch older than the one the library needs, or a missing file).
inline void load_torch_ops(const std::vector<std::string>& libraries = {}) {
  std::vector<std::string> all;
#ifdef OPBRIDGE_TORCH_OPS_LIBRARY
  all.emplace_back(OPBRIDGE_TORCH_OPS_LIBRARY);
#else
  throw std::runtime_error(
      "opbridge::load_torch_ops: OPBRIDGE_TORCH_OPS_LIBRARY is not defined: link the CMake target "
      "opbridge::torch_ops (find_package(opbridge)), which defines it");
#endif
  all.insert(all.end(), libraries.begin(), libraries.end());
  if (const char* env = std::getenv("OPBRIDGE_TORCH_LIBRARIES")) {
    std::string list(env);
    size_t begin = 0;
    while (begin <= list.size()) {
      const size_t end = list.find(':', begin);
      const std::string path = list.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      if (!path.empty()) all.push_back(path);
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  }
  for (const std::string& path : all) {
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = dlerror();
      throw std::runtime_error("opbridge::load_torch_ops: could not load " + path + ": " +
                               (why != nullptr ? why : "unknown reason"));
    }
  }
}

}  // namespace opbridge
