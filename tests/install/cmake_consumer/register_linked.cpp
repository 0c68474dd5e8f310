// opbridge_run_linked: links opbridge::ort and registers its ops without loading it by path.
#include <opbridge/ort/register_custom_ops.h>

#include "register.h"

bool register_linked_ops(Ort::SessionOptions& so) {
  Ort::ThrowOnError(RegisterCustomOps(so, OrtGetApiBase()));
  return true;
}
