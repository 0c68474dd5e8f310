// opbridge's ORT custom-op library entry points: RegisterCustomOps, all of library opbridge's ops
// in domain ai.opbridge, and opbridge's C ABI over the same ops (opbridge/c_abi.h).
#include "ort_op.h"
#include "register_custom_ops.h"

OPBRIDGE_ORT_LIBRARY(::opbridge::ort::kDomain, "opbridge")
