// opbridge's ORT custom-op library entry point: RegisterCustomOps, all ops in domain ai.opbridge.
#include "ort_op.h"
#include "register_custom_ops.h"

OPBRIDGE_ORT_LIBRARY_ENTRY(::opbridge::ort::kDomain)
