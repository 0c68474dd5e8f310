// opbridge's torch extension: the torch ops (namespace opbridge) of every compute function of
// library opbridge (opbridge/kernel.h), their schemas from the declarations and one generic
// kernel (torch_ops.cpp); and opbridge's C ABI over the same ops (opbridge/c_abi.h).
#include "opbridge/c_abi.h"
#include "torch_common.h"

OPBRIDGE_TORCH_LIBRARY("opbridge", "opbridge");
OPBRIDGE_C_ENTRY_POINTS("ai.opbridge", "opbridge")
