// How opbridge_run registers the ops of a custom-op library it is linked with.
#pragma once

#include <onnxruntime_cxx_api.h>

// Calls the linked library's RegisterCustomOps on `so`; false when no library is linked.
bool register_linked_ops(Ort::SessionOptions& so);
