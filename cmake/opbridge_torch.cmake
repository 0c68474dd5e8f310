# Locates the installed torch through Python (not find_package(Torch), which adds a global
# `dummy` target, bogus MKL link dirs and many seconds of configure time) and defines
#   opbridge::torch_libs      INTERFACE target for the torch extension, on the LibTorch stable ABI:
#                             torch's headers, TORCH_TARGET_VERSION (the oldest torch the binary
#                             loads into, OPBRIDGE_TORCH_TARGET), libtorch_cpu for the C shim.
#                             No C++ ABI define and no c10 / libtorch C++ library: nothing of
#                             libtorch's C++ API may be used (c10's headers refuse to compile).
#   opbridge::torch_cxx_libs  INTERFACE target for the optional fast-path library (libtorch's C++
#                             API: loads only into the torch it was built against)
#   OPBRIDGE_TORCH_VERSION    e.g. "2.13.0+cpu" ("" when torch is not used): the torch built against
#   OPBRIDGE_TORCH_TARGET     the oldest torch release the extension supports ("2.11")
#   OPBRIDGE_TORCH_HAS_CUDA   whether that torch was built with CUDA
set(OPBRIDGE_TORCH_VERSION "")
set(OPBRIDGE_TORCH_HAS_CUDA OFF)
# The stable ABI's targeting macro: major << 56 | minor << 48. 2.11: the first release whose
# stable ABI has what the ops need (boxed kernels, parallel_for, strings, lists, from_blob).
set(OPBRIDGE_TORCH_TARGET "2.11")
set(OPBRIDGE_TORCH_TARGET_VERSION "0x020B000000000000")
if(NOT OPBRIDGE_WITH_TORCH)
  return()
endif()

include(opbridge_find_torch)
_opbridge_ask_torch("${Python_EXECUTABLE}" _torch)
if(_torch_ERROR)
  message(FATAL_ERROR "opbridge: ${_torch_ERROR}.\n"
    "Install torch first and build with `pip install --no-build-isolation .`, "
    "or configure with -DOPBRIDGE_WITH_TORCH=OFF for an ORT-only build.")
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _mm "${_torch_VERSION}")
if(_mm VERSION_LESS OPBRIDGE_TORCH_TARGET)
  message(FATAL_ERROR "opbridge: torch ${_torch_VERSION} is older than ${OPBRIDGE_TORCH_TARGET}, the oldest torch whose "
    "stable ABI the extension is built on; install torch>=${OPBRIDGE_TORCH_TARGET}")
endif()

set(OPBRIDGE_TORCH_VERSION "${_torch_VERSION}")
if(_torch_CUDA)
  set(OPBRIDGE_TORCH_HAS_CUDA ON)
endif()
message(STATUS "opbridge: torch ${_torch_VERSION} (CUDA: ${_torch_CUDA}) at ${_torch_LIBRARY_DIRS}; stable ABI targeting ${OPBRIDGE_TORCH_TARGET}")

find_library(OPBRIDGE_TORCH_LIB_torch_cpu torch_cpu PATHS ${_torch_LIBRARY_DIRS} NO_DEFAULT_PATH REQUIRED)
add_library(opbridge_torch_libs INTERFACE)
add_library(opbridge::torch_libs ALIAS opbridge_torch_libs)
target_include_directories(opbridge_torch_libs SYSTEM INTERFACE ${_torch_INCLUDE_DIRS})
target_compile_definitions(opbridge_torch_libs INTERFACE TORCH_TARGET_VERSION=${OPBRIDGE_TORCH_TARGET_VERSION})
# The C shim (aoti_torch_*, torch_*) lives in libtorch_cpu, which torch has loaded already.
target_link_libraries(opbridge_torch_libs INTERFACE ${OPBRIDGE_TORCH_LIB_torch_cpu})

# The fast-path library: libtorch's C++ API, for exactly this torch.
add_library(opbridge_torch_cxx_libs INTERFACE)
add_library(opbridge::torch_cxx_libs ALIAS opbridge_torch_cxx_libs)
target_include_directories(opbridge_torch_cxx_libs SYSTEM INTERFACE ${_torch_INCLUDE_DIRS})
target_compile_definitions(opbridge_torch_cxx_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_CXX11_ABI})
set(_libs)
foreach(_l c10 torch_cpu)
  find_library(OPBRIDGE_TORCH_LIB_${_l} ${_l} PATHS ${_torch_LIBRARY_DIRS} NO_DEFAULT_PATH REQUIRED)
  list(APPEND _libs ${OPBRIDGE_TORCH_LIB_${_l}})
endforeach()
target_link_libraries(opbridge_torch_cxx_libs INTERFACE ${_libs})
