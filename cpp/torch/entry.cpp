// opbridge's torch extension: the torch ops (namespace opbridge) of every compute function of
// library opbridge (opbridge/kernel.h), their schemas from the declarations and one generic
// kernel (torch_ops.cpp).
#include "torch_common.h"

OPBRIDGE_TORCH_LIBRARY("opbridge", "opbridge");
