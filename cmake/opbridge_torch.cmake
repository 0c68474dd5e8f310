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

execute_process(
  COMMAND ${Python_EXECUTABLE} -c [=[
import torch, torch.utils.cpp_extension as ext
print(",".join(ext.include_paths()))
print(",".join(ext.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
print(torch.version.cuda or "-")
]=]
  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "opbridge: torch is not importable by ${Python_EXECUTABLE} (${_err}).\n"
    "Install torch first and build with `pip install --no-build-isolation .`, "
    "or configure with -DOPBRIDGE_WITH_TORCH=OFF for an ORT-only build.")
endif()
string(REPLACE "\n" ";" _lines "${_out}")
list(GET _lines 0 _inc)
list(GET _lines 1 _libdir)
list(GET _lines 2 _abi)
list(GET _lines 3 _ver)
list(GET _lines 4 _cuda)
if(_cuda STREQUAL "-")
  set(_cuda "")
endif()
string(REPLACE "," ";" _inc "${_inc}")
string(REPLACE "," ";" _libdir "${_libdir}")
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _mm "${_ver}")
if(_mm VERSION_LESS OPBRIDGE_TORCH_TARGET)
  message(FATAL_ERROR "opbridge: torch ${_ver} is older than ${OPBRIDGE_TORCH_TARGET}, the oldest torch whose "
    "stable ABI the extension is built on; install torch>=${OPBRIDGE_TORCH_TARGET}")
endif()

set(OPBRIDGE_TORCH_VERSION "${_ver}")
if(_cuda)
  set(OPBRIDGE_TORCH_HAS_CUDA ON)
endif()
message(STATUS "opbridge: torch ${_ver} (CUDA: ${_cuda}) at ${_libdir}; stable ABI targeting ${OPBRIDGE_TORCH_TARGET}")

find_library(OPBRIDGE_TORCH_LIB_torch_cpu torch_cpu PATHS ${_libdir} NO_DEFAULT_PATH REQUIRED)
add_library(opbridge_torch_libs INTERFACE)
add_library(opbridge::torch_libs ALIAS opbridge_torch_libs)
target_include_directories(opbridge_torch_libs SYSTEM INTERFACE ${_inc})
target_compile_definitions(opbridge_torch_libs INTERFACE TORCH_TARGET_VERSION=${OPBRIDGE_TORCH_TARGET_VERSION})
# The C shim (aoti_torch_*, torch_*) lives in libtorch_cpu, which torch has loaded already.
target_link_libraries(opbridge_torch_libs INTERFACE ${OPBRIDGE_TORCH_LIB_torch_cpu})

# The fast-path library: libtorch's C++ API, for exactly this torch.
add_library(opbridge_torch_cxx_libs INTERFACE)
add_library(opbridge::torch_cxx_libs ALIAS opbridge_torch_cxx_libs)
target_include_directories(opbridge_torch_cxx_libs SYSTEM INTERFACE ${_inc})
target_compile_definitions(opbridge_torch_cxx_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
set(_libs)
foreach(_l c10 torch_cpu)
  find_library(OPBRIDGE_TORCH_LIB_${_l} ${_l} PATHS ${_libdir} NO_DEFAULT_PATH REQUIRED)
  list(APPEND _libs ${OPBRIDGE_TORCH_LIB_${_l}})
endforeach()
target_link_libraries(opbridge_torch_cxx_libs INTERFACE ${_libs})
