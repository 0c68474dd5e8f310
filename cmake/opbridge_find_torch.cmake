# opbridge_find_torch([<error_var>]) - part of the installed opbridge CMake package.
#
# Defines the imported target opbridge::torch for the torch that the Python interpreter imports
# (Python_EXECUTABLE, or Python3_EXECUTABLE, else the one find_package(Python) finds): torch's
# headers, TORCH_TARGET_VERSION (the LibTorch stable ABI of torch opbridge_TORCH_TARGET: what you
# build loads into every torch from that release on) and libtorch_cpu for the C shim. Any torch
# from opbridge_TORCH_TARGET on will do; nothing of libtorch's C++ API is available (c10's headers
# refuse to compile under TORCH_TARGET_VERSION).
# Sets opbridge_TORCH_HAS_CUDA in the caller's scope. Does nothing if opbridge::torch exists.
# On failure: sets <error_var> to the reason and returns if given, else stops with an error.
#
# Like opbridge's own build, this asks Python instead of calling find_package(Torch), which
# adds a global `dummy` target, bogus MKL link directories and seconds of configure time.
include_guard(GLOBAL)

# _opbridge_ask_torch(<python> <prefix>): the torch that <python> imports, in the caller's scope:
# <prefix>_INCLUDE_DIRS and <prefix>_LIBRARY_DIRS (lists), <prefix>_CXX11_ABI (0 or 1),
# <prefix>_VERSION, <prefix>_CUDA (its CUDA version, "" for a CPU build); <prefix>_ERROR says why
# not where <python> cannot tell ("" otherwise). opbridge's own build asks the same way.
function(_opbridge_ask_torch py prefix)
  execute_process(
    COMMAND "${py}" -c [=[
import torch, torch.utils.cpp_extension as ext
print(",".join(ext.include_paths()))
print(",".join(ext.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
print(torch.version.cuda or "-")
]=]
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(${prefix}_ERROR "" PARENT_SCOPE)
  if(NOT rc EQUAL 0)
    set(${prefix}_ERROR "torch is not importable by ${py}: ${err}" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(LENGTH lines n)
  if(NOT n EQUAL 5)
    set(${prefix}_ERROR "unexpected answer from ${py} about torch: ${out}" PARENT_SCOPE)
    return()
  endif()
  list(GET lines 0 inc)
  list(GET lines 1 libdir)
  list(GET lines 2 abi)
  list(GET lines 3 version)
  list(GET lines 4 cuda)
  if(cuda STREQUAL "-")
    set(cuda "")
  endif()
  string(REPLACE "," ";" inc "${inc}")
  string(REPLACE "," ";" libdir "${libdir}")
  set(${prefix}_INCLUDE_DIRS "${inc}" PARENT_SCOPE)
  set(${prefix}_LIBRARY_DIRS "${libdir}" PARENT_SCOPE)
  set(${prefix}_CXX11_ABI "${abi}" PARENT_SCOPE)
  set(${prefix}_VERSION "${version}" PARENT_SCOPE)
  set(${prefix}_CUDA "${cuda}" PARENT_SCOPE)
endfunction()

function(opbridge_find_torch)
  set(err_var "${ARGV0}")
  if(TARGET opbridge::torch)
    get_target_property(has_cuda opbridge::torch OPBRIDGE_TORCH_HAS_CUDA)
    set(opbridge_TORCH_HAS_CUDA ${has_cuda} PARENT_SCOPE)
    return()
  endif()
  macro(_opbridge_torch_fail)
    string(CONCAT _msg ${ARGN})
    if(err_var)
      set(${err_var} "${_msg}" PARENT_SCOPE)
      return()
    endif()
    message(FATAL_ERROR "opbridge_find_torch: ${_msg}")
  endmacro()

  if(NOT opbridge_TORCH_VERSION)
    _opbridge_torch_fail("this opbridge was built without torch, so it has no torch adapter")
  endif()
  if(Python_EXECUTABLE)
    set(py "${Python_EXECUTABLE}")
  elseif(Python3_EXECUTABLE)
    set(py "${Python3_EXECUTABLE}")
  else()
    find_package(Python COMPONENTS Interpreter QUIET)
    if(NOT Python_EXECUTABLE)
      _opbridge_torch_fail("no Python interpreter found; set Python_EXECUTABLE to the one that imports torch")
    endif()
    set(py "${Python_EXECUTABLE}")
  endif()
  _opbridge_ask_torch("${py}" torch)
  if(torch_ERROR)
    _opbridge_torch_fail("${torch_ERROR}")
  endif()
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" mm "${torch_VERSION}")
  if(mm VERSION_LESS opbridge_TORCH_TARGET)
    _opbridge_torch_fail("${py} imports torch ${torch_VERSION}; opbridge's torch adapter is built on the stable ABI "
                         "of torch ${opbridge_TORCH_TARGET} and needs torch>=${opbridge_TORCH_TARGET} to build")
  endif()
  set(names torch_cpu)
  set(libs "")
  foreach(name IN LISTS names)
    find_library(lib_${name} NAMES ${name} PATHS ${torch_LIBRARY_DIRS} NO_DEFAULT_PATH NO_CACHE)
    if(NOT lib_${name})
      _opbridge_torch_fail("lib${name} not found in ${torch_LIBRARY_DIRS}")
    endif()
    list(APPEND libs "${lib_${name}}")
  endforeach()

  # GLOBAL: one torch per build, usable from every directory of the project.
  add_library(opbridge::torch INTERFACE IMPORTED GLOBAL)
  set_target_properties(opbridge::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${torch_INCLUDE_DIRS}"
    INTERFACE_COMPILE_DEFINITIONS "TORCH_TARGET_VERSION=${opbridge_TORCH_TARGET_VERSION}"
    INTERFACE_LINK_LIBRARIES "${libs}")
  set(has_cuda OFF)
  if(torch_CUDA)
    set(has_cuda ON)
  endif()
  set_target_properties(opbridge::torch PROPERTIES OPBRIDGE_TORCH_HAS_CUDA ${has_cuda})
  set(opbridge_TORCH_HAS_CUDA ${has_cuda} PARENT_SCOPE)
  message(STATUS "opbridge: torch ${torch_VERSION} (CUDA: ${torch_CUDA}) from ${py}")
endfunction()
