# Locates the installed torch through Python (not find_package(Torch), which adds a global
# `dummy` target, bogus MKL link dirs and many seconds of configure time) and defines
#   opbridge::torch_libs      INTERFACE target: torch headers, ABI define, c10/torch_cpu libs
#   OPBRIDGE_TORCH_VERSION    e.g. "2.13.0+cpu" ("" when torch is not used)
#   OPBRIDGE_TORCH_HAS_CUDA   whether that torch was built with CUDA
# When torch's intra-op backend is OpenMP (the Linux wheels), torch_libs also carries OpenMP.
set(OPBRIDGE_TORCH_VERSION "")
set(OPBRIDGE_TORCH_HAS_CUDA OFF)
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
print(int("parallel backend: OpenMP" in torch.__config__.parallel_info()))
print(torch.version.cuda or "")
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
list(GET _lines 4 _openmp)
list(LENGTH _lines _n)
set(_cuda "")
if(_n GREATER 5)
  list(GET _lines 5 _cuda)
endif()
string(REPLACE "," ";" _inc "${_inc}")
string(REPLACE "," ";" _libdir "${_libdir}")

set(OPBRIDGE_TORCH_VERSION "${_ver}")
if(_cuda)
  set(OPBRIDGE_TORCH_HAS_CUDA ON)
endif()
message(STATUS "opbridge: torch ${_ver} (CUDA: ${_cuda}) at ${_libdir}")

add_library(opbridge_torch_libs INTERFACE)
add_library(opbridge::torch_libs ALIAS opbridge_torch_libs)
target_include_directories(opbridge_torch_libs SYSTEM INTERFACE ${_inc})
target_compile_definitions(opbridge_torch_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
set(_libs)
foreach(_l c10 torch_cpu torch)
  find_library(OPBRIDGE_TORCH_LIB_${_l} ${_l} PATHS ${_libdir} NO_DEFAULT_PATH REQUIRED)
  list(APPEND _libs ${OPBRIDGE_TORCH_LIB_${_l}})
endforeach()
if(OPBRIDGE_TORCH_HAS_CUDA)
  foreach(_l c10_cuda torch_cuda)
    find_library(OPBRIDGE_TORCH_LIB_${_l} ${_l} PATHS ${_libdir} NO_DEFAULT_PATH REQUIRED)
    list(APPEND _libs ${OPBRIDGE_TORCH_LIB_${_l}})
  endforeach()
endif()
target_link_libraries(opbridge_torch_libs INTERFACE ${_libs})

# at::parallel_for is header-only: with torch's OpenMP backend it parallelizes only in code
# compiled with OpenMP, and runs serially otherwise. We link the OpenMP runtime torch ships
# (torch/lib/libgomp.so.1) where there is one, so that our loops share torch's thread pool and
# follow torch.set_num_threads.
if(_openmp)
  find_package(OpenMP COMPONENTS CXX)
  find_library(OPBRIDGE_TORCH_LIB_gomp NAMES libgomp.so.1 gomp PATHS ${_libdir} NO_DEFAULT_PATH)
  if(OpenMP_CXX_FOUND AND OPBRIDGE_TORCH_LIB_gomp)
    separate_arguments(_omp_flags NATIVE_COMMAND "${OpenMP_CXX_FLAGS}")
    target_compile_options(opbridge_torch_libs INTERFACE ${_omp_flags})
    target_link_libraries(opbridge_torch_libs INTERFACE ${OPBRIDGE_TORCH_LIB_gomp})
  elseif(OpenMP_CXX_FOUND)
    target_link_libraries(opbridge_torch_libs INTERFACE OpenMP::OpenMP_CXX)
  else()
    message(WARNING "opbridge: torch uses OpenMP but the compiler has no OpenMP support; "
                    "opbridge's torch ops will run single-threaded")
  endif()
endif()
