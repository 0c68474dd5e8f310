# opbridge_sanitize.cmake - OPBRIDGE_SANITIZE=ON builds every opbridge target with
# AddressSanitizer + UndefinedBehaviorSanitizer (scripts/sanitize.sh drives it). For testing only:
# such a library needs libasan loaded first (LD_PRELOAD) in an uninstrumented Python.
#
# Include before any target is created: the flags apply to targets defined after this point.

include_guard(GLOBAL)
option(OPBRIDGE_SANITIZE "Build with -fsanitize=address,undefined (testing only, never for wheels)" OFF)
if(NOT OPBRIDGE_SANITIZE)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  message(FATAL_ERROR "OPBRIDGE_SANITIZE needs GCC or Clang (this is ${CMAKE_CXX_COMPILER_ID})")
endif()
# -fno-sanitize-recover: a UB report aborts the process, so a test run cannot pass over one.
# -g1: line tables for readable reports at a fraction of -g's compile time.
# -O1 (after the build type's -O3, so it wins): the instrumented templates compile 1.5x faster than
# at -O2 (group_norm_cpu.cpp 75 s against 116 s, GCC 12, 2 cores busy), where -O2 was 2.4x faster than
# -O3 (group_norm_cpu_avx2.cpp 74 s against 175-190 s); the sanitizers check the accesses the source
# makes at any level. The instruction-set files (*_cpu_avx2.cpp, *_cpu_avx512.cpp) get -O2
# (OPBRIDGE_SANITIZE_ISA_OPTIONS, read by opbridge_add_op): their intrinsics may take immediates
# that exist only once `#pragma GCC unroll` has unrolled a loop (the AVX2 Inverse kernels' blend
# masks, 1 << k), which -O1 does not do ("the last argument must be an 8-bit immediate").
set(_opbridge_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_opbridge_san};-g1;-O1>")
set(OPBRIDGE_SANITIZE_ISA_OPTIONS -O2)
add_link_options(-fsanitize=address,undefined)
message(STATUS "opbridge: AddressSanitizer + UndefinedBehaviorSanitizer build")

# The installed CMake package ships instrumented static libraries (opbridge::kernels, ...): their
# consumers must link the sanitizer runtimes too, so every static library passes the link option
# on. Deferred to the end of the configure, when the targets exist.
function(_opbridge_sanitize_static_interfaces)
  get_property(_targets DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_t IN LISTS _targets)
    get_target_property(_type ${_t} TYPE)
    if(_type STREQUAL "STATIC_LIBRARY")
      target_link_options(${_t} INTERFACE -fsanitize=address,undefined)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${PROJECT_SOURCE_DIR}" CALL _opbridge_sanitize_static_interfaces)
