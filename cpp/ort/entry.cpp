// opbridge's ORT custom-op library entry points: RegisterCustomOps, all of library opbridge's ops
// in domain ai.opbridge, and the ones Python reads (opbridge/_decl.py).
#include "ort_op.h"
#include "register_custom_ops.h"

OPBRIDGE_ORT_LIBRARY(::opbridge::ort::kDomain, "opbridge")
