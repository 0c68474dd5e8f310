// The entry point of an ORT custom-op library built on opbridge: libopbridge_ort.so, or a
// library of your own ops made with opbridge_add_op(). Include it in a C++ program that links
// such a library (CMake: opbridge::ort) and registers its ops without loading it by path:
//
//   Ort::SessionOptions so;
//   Ort::ThrowOnError(RegisterCustomOps(so, OrtGetApiBase()));
//
// (The same as so.RegisterCustomOpsLibrary("libopbridge_ort.so"), with the library linked
// instead of opened at run time.)
#pragma once

#include <onnxruntime_c_api.h>

extern "C" {
// Adds the library's ops, in its custom-op domain, to `options`.
//   options:  the session options to register with
//   api_base: OrtGetApiBase() of the ONNX Runtime that runs the session (>= 1.17)
// Returns nullptr on success, else an error status the caller releases (ReleaseStatus).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                 const OrtApiBase* api_base);
}
