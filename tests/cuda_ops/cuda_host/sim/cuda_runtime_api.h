// Host stand-in for the CUDA runtime header (tests only): see simt.h.
#pragma once
#include "simt.h"
