// opbridge_run: links no custom-op library (libraries are registered by path with --library).
#include "register.h"

bool register_linked_ops(Ort::SessionOptions&) { return false; }
