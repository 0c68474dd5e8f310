# CUDA detection: OPBRIDGE_WITH_CUDA=AUTO compiles the CUDA kernels wherever nvcc is found
# (ON: required, OFF: never). Defines
#   OPBRIDGE_CUDA_ENABLED   whether the CUDA kernels are built
#   OPBRIDGE_CUDA_VERSION   nvcc's version ("" when disabled)
#   opbridge_cuda_kernels   (when enabled) object library of the framework-free launchers and
#                           the ops' CUDA compute functions; opbridge_add_op() adds
#                           ops/<op>/<op>_kernel.cu to it
#   opbridge_link_cuda(<target>)  (when enabled) links the kernels and the static CUDA runtime
#                           into an adapter library
set(OPBRIDGE_CUDA_ENABLED OFF)
set(OPBRIDGE_CUDA_VERSION "")
# Real code for Ampere (80), Hopper (90), Blackwell datacenter (100) and consumer (120), plus
# compute_120 PTX that the driver JIT-compiles for newer GPUs. Each real arch costs compile time:
# a build for one GPU takes OPBRIDGE_CUDA_ARCHITECTURES=90-real (or "native"). CMake's own
# CMAKE_CUDA_ARCHITECTURES / CUDAARCHS, when the user gives them, are the default (checked before
# enable_language(CUDA), which would fill CMAKE_CUDA_ARCHITECTURES with nvcc's default).
set(_opbridge_archs "80-real;90-real;100-real;120-real;120-virtual")
if(NOT "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "")
  set(_opbridge_archs "${CMAKE_CUDA_ARCHITECTURES}")
elseif(NOT "$ENV{CUDAARCHS}" STREQUAL "")
  set(_opbridge_archs "$ENV{CUDAARCHS}")
endif()
set(OPBRIDGE_CUDA_ARCHITECTURES "${_opbridge_archs}" CACHE STRING
    "CUDA architectures of the opbridge kernels (CMake CUDA_ARCHITECTURES syntax)")
if(OPBRIDGE_WITH_CUDA STREQUAL "OFF")
  return()
endif()
if(NOT OPBRIDGE_WITH_CUDA MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "OPBRIDGE_WITH_CUDA='${OPBRIDGE_WITH_CUDA}', expected AUTO, ON or OFF")
endif()
include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  # The toolkit's standard location is often not on PATH.
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(OPBRIDGE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "OPBRIDGE_WITH_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
  message(STATUS "opbridge: no nvcc found, CUDA kernels not built")
  return()
endif()

enable_language(CUDA)
# Headers and the static runtime of the toolkit that belongs to this nvcc.
find_package(CUDAToolkit REQUIRED)
set(OPBRIDGE_CUDA_ENABLED ON)
set(OPBRIDGE_CUDA_VERSION "${CMAKE_CUDA_COMPILER_VERSION}")
message(STATUS "opbridge: CUDA kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "architectures ${OPBRIDGE_CUDA_ARCHITECTURES})")

# device.cpp is host code: compiled by the C++ compiler, not by nvcc for every architecture.
# Objects, linked into the ORT library and the torch extension: each gets every CUDA compute
# function's registration (OPBRIDGE_KERNEL).
add_library(opbridge_cuda_kernels OBJECT ${PROJECT_SOURCE_DIR}/cuda/common/device.cpp)
target_compile_definitions(opbridge_cuda_kernels PRIVATE OPBRIDGE_LIBRARY_NAME="opbridge")
target_include_directories(opbridge_cuda_kernels
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/cpp/include>
  PRIVATE ${PROJECT_SOURCE_DIR}/cuda)
target_link_libraries(opbridge_cuda_kernels PRIVATE CUDA::toolkit)
target_compile_features(opbridge_cuda_kernels PRIVATE cuda_std_17)
set_target_properties(opbridge_cuda_kernels PROPERTIES
  CUDA_ARCHITECTURES "${OPBRIDGE_CUDA_ARCHITECTURES}"
  # Kernels are launched from the file that defines them: no relocatable device code, no
  # device link step.
  CUDA_SEPARABLE_COMPILATION OFF
  # The runtime is linked by the adapters (opbridge_link_cuda), not propagated from here.
  CUDA_RUNTIME_LIBRARY None
  CUDA_VISIBILITY_PRESET hidden
  POSITION_INDEPENDENT_CODE ON)
target_compile_options(opbridge_cuda_kernels PRIVATE
  # Host-side warnings as for the C++ code; device-side ones from nvcc itself.
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra> $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)

# The default-stream check (cuda/check_streams.py) runs before the kernels compile, so a kernel
# launched on the default stream fails the build. It reads cuda/common and the folder of every
# op opbridge_add_op() adds (OPBRIDGE_CHECKED_DIRS), and re-runs when a file it read changes
# (the depfile it writes lists them).
set(_opbridge_stream_stamp ${CMAKE_CURRENT_BINARY_DIR}/opbridge_check_streams.stamp)
add_custom_command(
  OUTPUT ${_opbridge_stream_stamp}
  COMMAND ${Python_EXECUTABLE} ${PROJECT_SOURCE_DIR}/cuda/check_streams.py
          --depfile ${_opbridge_stream_stamp}.d --target ${_opbridge_stream_stamp}
          "$<TARGET_PROPERTY:opbridge_cuda_kernels,OPBRIDGE_CHECKED_DIRS>"
  COMMAND ${CMAKE_COMMAND} -E touch ${_opbridge_stream_stamp}
  DEPENDS ${PROJECT_SOURCE_DIR}/cuda/check_streams.py
  DEPFILE ${_opbridge_stream_stamp}.d
  COMMENT "Checking the CUDA sources for default-stream launches"
  COMMAND_EXPAND_LISTS VERBATIM)
add_custom_target(opbridge_check_streams DEPENDS ${_opbridge_stream_stamp})
set_property(TARGET opbridge_cuda_kernels PROPERTY OPBRIDGE_CHECKED_DIRS ${PROJECT_SOURCE_DIR}/cuda/common)
add_dependencies(opbridge_cuda_kernels opbridge_check_streams)

# Static cudart (CMake's default runtime): the libraries load and run their CPU ops on machines
# without a CUDA runtime or driver, and do not depend on which libcudart the host process (e.g.
# a torch built for another CUDA version) loads. Streams are driver objects, so a stream created
# by the framework's runtime is valid in ours. libcudart_static's symbols are hidden (checked
# with nm -D on a test library), so our copy neither interposes on the process's libcudart nor
# gets interposed by it, also in the torch library, which has no version script.
function(opbridge_link_cuda target)
  target_link_libraries(${target} PRIVATE opbridge_cuda_kernels CUDA::cudart_static)
endfunction()
