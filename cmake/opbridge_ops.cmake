# opbridge_add_op() - one op, declared once, built into an ORT custom-op library and a torch
# extension. The same function builds opbridge's own ops (the superbuild) and users' ops (it is
# part of the installed CMake package: find_package(opbridge) brings it).
#
#   opbridge_add_op(<op> [LIBRARY <lib>] [DOMAIN <domain>] [NAMESPACE <ns>]
#                   [DIR <dir>] [NO_TORCH])
#
# The op's files are found by name in one folder, DIR (default: <ops dir>/<op>, see below):
#   <op>.h                        its header (the kernels' parameters, what a C++ program calls):
#                                 recorded in the library's OPBRIDGE_OP_HEADERS property (the
#                                 superbuild installs opbridge's as include/opbridge/<op>.h)
#   <op>_decl.cpp                 its declarations (opbridge/op_decl.h) and the function from a
#                                 checked call to its kernel's arguments     -> <lib>_kernels  required
#   <op>_cpu.cpp                  framework-free CPU kernel and its compute functions
#                                 (OPBRIDGE_KERNEL, opbridge/kernel.h)       -> <lib>_kernels
#   <op>_cpu_isa.cpp              hot loops, compiled once per instruction set (x86-64: avx2,
#                                 avx512): opbridge_add_op generates <op>_cpu_<isa>.cpp files that
#                                 define OPBRIDGE_ISA_<ISA> (OPBRIDGE_ISA_FN names the functions,
#                                 opbridge/cpu_isa.h) and include it; the kernel picks one at run
#                                 time with opbridge::cpu_isa()
#   <op>_cpu_avx2.cpp, <op>_cpu_avx512.cpp  the same written by hand (one file per instruction set)
# and, only where the project has enabled CUDA (enable_language(CUDA)):
#   <op>_kernel.cu                CUDA launcher and its compute functions
#                                 (OPBRIDGE_KERNEL)   -> <lib>_cuda_kernels if it exists, else <lib>_kernels
# One generic adapter per framework serves every registered compute function: the library's torch
# ops (schema from the declaration, one boxed kernel), its ORT ops (CPU and CUDA execution
# providers, shape inference) and opbridge's C ABI (opbridge/c_abi.h: the declarations, their
# checks and the CPU compute functions for Python, which both libraries export) are derived;
# nothing of the op is written per framework. Adding an op is one opbridge_add_op line: no list of
# ops is kept anywhere else.
#
# LIBRARY (default: <op>) names the targets, so that several ops share one library:
#   <lib>_kernels  object library (position-independent), compiled once and linked into both
#                  libraries below, with OPBRIDGE_LIBRARY_NAME="<lib>"; links opbridge::kernels
#                  (<opbridge/op_decl.h>, <opbridge/kernel.h>, ...)
#   <lib>_ort      lib<lib>_ort.so, the ORT custom-op library: its RegisterCustomOps (generated)
#                  registers every op of the library in DOMAIN; a version script exports only the
#                  entry points (and the C ABI), so it shares a process with libopbridge_ort.so. Once linked, its
#                  declarations are checked (opbridge::check_declarations): a misdeclared op fails
#                  the build, named with what is wrong (OPBRIDGE_CHECK_DECLARATIONS=OFF: at import)
#   <lib>_torch    lib<lib>_torch.so, for torch.ops.load_library(), built unless the library or
#                  the op says NO_TORCH (or the torch of the project's Python is not found): on the
#                  LibTorch stable ABI, so it loads into every torch from opbridge_TORCH_TARGET
#                  on, whichever torch (>= that) it was built with (opbridge_find_torch())
# The first op of a library makes its targets (opbridge_add_op_library, DOMAIN required) unless
# they exist already: opbridge's superbuild makes its own and declares them with
# opbridge_add_op_library() (its op sources go to opbridge_ops, the target named by the
# OPBRIDGE_KERNELS_TARGET property of opbridge_ort). Later ops of the library may omit DOMAIN and
# NAMESPACE. NAMESPACE (default: <lib>) is the torch namespace of the library's ops.
include_guard(GLOBAL)

# Run-time instruction-set dispatch (x86-64 with GCC or Clang): the *_cpu_<isa>.cpp files are
# compiled with these flags into separately named functions, and opbridge::cpu_isa() picks one
# at run time. Everything else stays at the compiler's baseline (no -march=native: the library
# must run on any x86-64 CPU). avx2 = x86-64-v3's vector subset; avx512 = x86-64-v4's.
option(OPBRIDGE_CPU_DISPATCH "Build AVX2 / AVX-512 variants of hot CPU kernels (x86-64)" ON)
set(OPBRIDGE_X86_DISPATCH OFF)
if(OPBRIDGE_CPU_DISPATCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$"
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(OPBRIDGE_X86_DISPATCH ON)
  set(OPBRIDGE_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
  set(OPBRIDGE_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c)
endif()

# opbridge's C ABI (opbridge/c_abi.h): what every library built on opbridge exports.
set(OPBRIDGE_C_ABI_SYMBOLS OpbridgeDescribeOps OpbridgeCheckCall OpbridgeRunHost OpbridgeDeclarationErrors
    OpbridgeAbiLayout)

# opbridge_export_only(<target> [<symbol>...]): the shared library <target> exports these symbols
# and nothing else (a version script). Hidden visibility alone still leaks weak std:: symbols, and a
# toolchain that links libstdc++ statically (seen: GCC 13.3 in /opt/gcc) exports all of it; in a
# process that has loaded another libstdc++ first (torch's) those symbols then bind across
# libraries, and the first ostream insertion crashed. Two libraries on opbridge's adapters must not
# share their globals either.
function(opbridge_export_only target)
  set(map "${CMAKE_CURRENT_BINARY_DIR}/${target}_exports.map")
  if(ARGN)
    list(JOIN ARGN "; " syms)
    file(CONFIGURE OUTPUT "${map}" CONTENT "{\n  global: ${syms};\n  local: *;\n};\n")
  else()
    file(CONFIGURE OUTPUT "${map}" CONTENT "{\n  local: *;\n};\n")
  endif()
  target_link_options(${target} PRIVATE "LINKER:--version-script=${map}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${map}")
endfunction()

# opbridge_add_op_library(<lib> DOMAIN <domain> [NAMESPACE <ns>] [OPS_DIR <dir>] [NO_TORCH])
# Declares the library <lib>: its ONNX domain, torch namespace (default <lib>) and the folder that
# holds one folder per op (default ${CMAKE_CURRENT_SOURCE_DIR}/ops).
# Makes <lib>_kernels and <lib>_ort where they do not exist (<lib>_torch: on first need).
function(opbridge_add_op_library lib)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_TORCH" "DOMAIN;NAMESPACE;OPS_DIR" "")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "opbridge_add_op_library(${lib}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT lib MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "opbridge_add_op_library: library name '${lib}' must be a C identifier "
                        "(it names targets and files)")
  endif()
  if(NOT arg_DOMAIN)
    message(FATAL_ERROR "opbridge_add_op_library(${lib}): DOMAIN <onnx domain> is required (e.g. com.example.${lib})")
  endif()
  # The domain goes into a C string literal.
  if(NOT arg_DOMAIN MATCHES "^[A-Za-z0-9_.-]+$")
    message(FATAL_ERROR "opbridge_add_op_library(${lib}): DOMAIN '${arg_DOMAIN}' may only hold letters, "
                        "digits, '.', '_' and '-'")
  endif()
  set(ns "${lib}")
  if(arg_NAMESPACE)
    set(ns "${arg_NAMESPACE}")
  endif()
  # TORCH_LIBRARY's namespace is a C++ identifier.
  if(NOT ns MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "opbridge_add_op_library(${lib}): NAMESPACE '${ns}' must be a C identifier "
                        "(torch.ops.<namespace>)")
  endif()
  set(ops_dir "${CMAKE_CURRENT_SOURCE_DIR}/ops")
  if(arg_OPS_DIR)
    get_filename_component(ops_dir "${arg_OPS_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  endif()

  if(TARGET ${lib}_ort)
    get_target_property(known ${lib}_ort OPBRIDGE_DOMAIN)
    if(known)
      message(FATAL_ERROR "opbridge_add_op_library(${lib}): the library is declared already (domain ${known})")
    endif()
  else()
    if(arg_DOMAIN STREQUAL "ai.opbridge")
      message(FATAL_ERROR "opbridge_add_op_library(${lib}): DOMAIN ai.opbridge is opbridge's own; "
                          "use a domain of yours")
    endif()
    _opbridge_make_library(${lib} "${arg_DOMAIN}")
  endif()
  set_target_properties(${lib}_ort PROPERTIES
    OPBRIDGE_DOMAIN "${arg_DOMAIN}" OPBRIDGE_NAMESPACE "${ns}" OPBRIDGE_OPS_DIR "${ops_dir}"
    OPBRIDGE_NO_TORCH "${arg_NO_TORCH}")
  _opbridge_check_declarations(${lib})
endfunction()

# After <lib>_ort links: the declarations of its ops, read from the library itself. A misdeclared
# op (one torch's schema parser or ONNX Runtime would refuse, a rule that does not parse, ...)
# fails the build, naming the op and the argument, instead of every process that loads the
# library. -DOPBRIDGE_CHECK_DECLARATIONS=OFF leaves the check to import time (Python raises
# MisdeclaredOpError there; torch and ONNX Runtime still load the library's other ops). Not where
# the built library cannot run here (cross builds).
function(_opbridge_check_declarations lib)
  get_target_property(done ${lib}_ort OPBRIDGE_DECLARATIONS_CHECKED)
  if(done OR CMAKE_CROSSCOMPILING OR NOT TARGET opbridge::check_declarations
     OR (DEFINED OPBRIDGE_CHECK_DECLARATIONS AND NOT OPBRIDGE_CHECK_DECLARATIONS))
    return()
  endif()
  add_custom_command(TARGET ${lib}_ort POST_BUILD
    COMMAND opbridge::check_declarations "$<TARGET_FILE:${lib}_ort>"
    COMMENT "Checking the declarations of ${lib}'s ops" VERBATIM)
  set_target_properties(${lib}_ort PROPERTIES OPBRIDGE_DECLARATIONS_CHECKED ON)
endfunction()

# The targets of a library of users' ops (installed package: opbridge::* targets exist).
function(_opbridge_make_library lib domain)
  foreach(t kernels ort_adapter)
    if(NOT TARGET opbridge::${t})
      message(FATAL_ERROR "opbridge_add_op_library(${lib}): no target opbridge::${t}; "
                          "call find_package(opbridge) first")
    endif()
  endforeach()
  if(NOT TARGET ${lib}_kernels)
    # Objects, linked into every library of the op (not an archive, whose members with nothing but
    # a registration would be left out).
    add_library(${lib}_kernels OBJECT)
    target_link_libraries(${lib}_kernels PUBLIC opbridge::kernels)
    set_target_properties(${lib}_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON
      CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
    target_compile_definitions(${lib}_kernels PRIVATE OPBRIDGE_LIBRARY_NAME="${lib}")
    if(OPBRIDGE_X86_DISPATCH)
      target_compile_definitions(${lib}_kernels PRIVATE OPBRIDGE_X86_DISPATCH=1)
    endif()
  endif()
  add_library(${lib}_ort SHARED)
  set(entry "${CMAKE_CURRENT_BINARY_DIR}/${lib}_ort_entry.cpp")
  file(CONFIGURE OUTPUT "${entry}" @ONLY CONTENT [=[
// Generated by opbridge_add_op_library(): entry points of lib@lib@_ort.so, the ops of library
// @lib@ in domain @domain@.
#include <opbridge/ort/ort_op.h>
#include <opbridge/ort/register_custom_ops.h>

OPBRIDGE_ORT_LIBRARY("@domain@", "@lib@")
]=])
  target_sources(${lib}_ort PRIVATE "${entry}")
  target_link_libraries(${lib}_ort PRIVATE ${lib}_kernels opbridge::ort_adapter)
  # The entry points only (opbridge_export_only). nodelete: kept loaded once ONNX Runtime has
  # loaded it (opbridge's own ORT library says why).
  opbridge_export_only(${lib}_ort RegisterCustomOps ${OPBRIDGE_C_ABI_SYMBOLS})
  target_link_options(${lib}_ort PRIVATE "LINKER:--no-undefined" "LINKER:-z,nodelete")
  set_target_properties(${lib}_ort PROPERTIES
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON OPBRIDGE_MADE_HERE ON)
endfunction()

# Makes <lib>_torch; sets <result> to whether it could (it cannot without torch: an opbridge built
# without it, or no torch in the project's Python).
function(_opbridge_make_torch lib op result)
  set(${result} OFF PARENT_SCOPE)
  if(NOT TARGET opbridge::torch_adapter)
    message(STATUS "opbridge_add_op(${op}): this opbridge was built without torch: ORT library only")
    return()
  endif()
  opbridge_find_torch(why)
  if(NOT TARGET opbridge::torch)
    message(STATUS "opbridge_add_op(${op}): no torch (${why}): ORT library only")
    return()
  endif()
  add_library(${lib}_torch SHARED)
  get_target_property(ns ${lib}_ort OPBRIDGE_NAMESPACE)
  get_target_property(domain ${lib}_ort OPBRIDGE_DOMAIN)
  set(entry "${CMAKE_CURRENT_BINARY_DIR}/${lib}_torch_entry.cpp")
  file(CONFIGURE OUTPUT "${entry}" @ONLY CONTENT [=[
// Generated by opbridge_add_op(): the torch ops of library @lib@ (torch namespace @ns@): their
// schemas from the declarations and the generic kernel for every registered compute function;
// and opbridge's C ABI over the same ops (domain @domain@).
#include <opbridge/c_abi.h>
#include <opbridge/torch/torch_common.h>

OPBRIDGE_TORCH_LIBRARY("@ns@", "@lib@");
OPBRIDGE_C_ENTRY_POINTS("@domain@", "@lib@")
]=])
  target_sources(${lib}_torch PRIVATE "${entry}")
  target_link_libraries(${lib}_torch PRIVATE ${lib}_kernels opbridge::torch_adapter)
  opbridge_export_only(${lib}_torch ${OPBRIDGE_C_ABI_SYMBOLS})
  set_target_properties(${lib}_torch PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  set(${result} ON PARENT_SCOPE)
endfunction()

# Links the static CUDA runtime into a users' library once (like opbridge's own: the ORT library
# then loads on machines without a CUDA install).
function(_opbridge_link_cudart lib)
  get_target_property(done ${lib}_kernels OPBRIDGE_CUDART)
  if(NOT done)
    find_package(CUDAToolkit REQUIRED)
    target_link_libraries(${lib}_kernels PUBLIC CUDA::cudart_static)
    target_compile_features(${lib}_kernels PRIVATE cuda_std_17)
    set_target_properties(${lib}_kernels PROPERTIES OPBRIDGE_CUDART ON)
  endif()
endfunction()

function(opbridge_add_op op)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_TORCH" "LIBRARY;DOMAIN;NAMESPACE;DIR" "")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "opbridge_add_op(${op}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT op MATCHES "^[a-z_][a-z0-9_]*$")
    message(FATAL_ERROR "opbridge_add_op: op name '${op}' must be snake_case (the files are named <op>_*.cpp)")
  endif()
  set(lib "${op}")
  if(arg_LIBRARY)
    set(lib "${arg_LIBRARY}")
  endif()

  # ---- the library: declared by the first op that names it, or by the project ----
  set(declared "")
  if(TARGET ${lib}_ort)
    get_target_property(declared ${lib}_ort OPBRIDGE_DOMAIN)
  endif()
  if(NOT declared)
    if(NOT arg_DOMAIN)
      message(FATAL_ERROR "opbridge_add_op(${op}): DOMAIN <onnx domain> is required for the first op of "
                          "library ${lib} (e.g. com.example.${lib})")
    endif()
    set(extra "")
    if(arg_NAMESPACE)
      list(APPEND extra NAMESPACE "${arg_NAMESPACE}")
    endif()
    opbridge_add_op_library(${lib} DOMAIN "${arg_DOMAIN}" ${extra})
  endif()
  get_target_property(domain ${lib}_ort OPBRIDGE_DOMAIN)
  get_target_property(ns ${lib}_ort OPBRIDGE_NAMESPACE)
  if(arg_DOMAIN AND NOT arg_DOMAIN STREQUAL domain)
    message(FATAL_ERROR "opbridge_add_op(${op}): library ${lib} registers its ops in domain ${domain}, "
                        "not ${arg_DOMAIN} (one domain per library)")
  endif()
  if(arg_NAMESPACE AND NOT arg_NAMESPACE STREQUAL ns)
    message(FATAL_ERROR "opbridge_add_op(${op}): library ${lib} has torch namespace ${ns}, not ${arg_NAMESPACE}")
  endif()

  get_target_property(ops_dir ${lib}_ort OPBRIDGE_OPS_DIR)
  set(dir "${ops_dir}/${op}")
  if(arg_DIR)
    get_filename_component(dir "${arg_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  endif()

  if(NOT EXISTS "${dir}/${op}_decl.cpp")
    message(FATAL_ERROR "opbridge_add_op(${op}): ${dir}/${op}_decl.cpp does not exist (every op has a "
                        "declaration; see docs/cpp.md, \"Writing your own op\")")
  endif()

  get_property(langs GLOBAL PROPERTY ENABLED_LANGUAGES)
  set(with_cuda OFF)
  if("CUDA" IN_LIST langs)
    set(with_cuda ON)
  endif()
  set(cu "${dir}/${op}_kernel.cu")
  if(NOT EXISTS "${dir}/${op}_cpu.cpp" AND NOT (with_cuda AND EXISTS "${cu}"))
    message(FATAL_ERROR "opbridge_add_op(${op}): no kernel: ${dir}/${op}_cpu.cpp does not exist"
                        " (nor, with CUDA enabled, ${cu})")
  endif()

  if(EXISTS "${dir}/${op}.h")
    set_property(TARGET ${lib}_ort APPEND PROPERTY OPBRIDGE_OP_HEADERS "${dir}/${op}.h")
  endif()

  # ---- kernels, their compute functions and the declaration ----
  # The target the library's op sources go to: <lib>_kernels, or the one the library names.
  get_target_property(kernels ${lib}_ort OPBRIDGE_KERNELS_TARGET)
  if(NOT kernels)
    set(kernels ${lib}_kernels)
  endif()
  target_sources(${kernels} PRIVATE "${dir}/${op}_decl.cpp")
  if(EXISTS "${dir}/${op}_cpu.cpp")
    target_sources(${kernels} PRIVATE "${dir}/${op}_cpu.cpp")
  endif()
  if(OPBRIDGE_X86_DISPATCH)
    foreach(isa avx2 avx512)
      string(TOUPPER "${isa}" ISA)
      set(src "${dir}/${op}_cpu_${isa}.cpp")
      if(EXISTS "${dir}/${op}_cpu_isa.cpp")
        # One source for every instruction set: a file per set that includes it.
        set(src "${CMAKE_CURRENT_BINARY_DIR}/opbridge_isa/${lib}/${op}_cpu_${isa}.cpp")
        set(isa_source "${dir}/${op}_cpu_isa.cpp")
        file(CONFIGURE OUTPUT "${src}" @ONLY CONTENT [=[
// Generated by opbridge_add_op(): @op@_cpu_isa.cpp for the @isa@ instruction set, compiled with
// its flags (called only where opbridge::cpu_isa() allows @isa@).
#define OPBRIDGE_ISA_@ISA@ 1
#include "@isa_source@"
]=])
      endif()
      if(EXISTS "${src}")
        target_sources(${kernels} PRIVATE "${src}")
        # OPBRIDGE_SANITIZE_ISA_OPTIONS: the sanitizer build's level for these files (opbridge_sanitize.cmake).
        set(isa_options ${OPBRIDGE_ISA_FLAGS_${isa}} ${OPBRIDGE_SANITIZE_ISA_OPTIONS})
        set_source_files_properties("${src}" TARGET_DIRECTORY ${kernels}
                                    PROPERTIES COMPILE_OPTIONS "${isa_options}")
      endif()
    endforeach()
  endif()

  # Adapters written by hand (projects of an earlier `opbridge new-op`) are no longer built: the
  # generic adapters serve every op, and a leftover file would otherwise be silently ignored.
  set(hand_written "")
  foreach(f ${op}_ort.cpp ${op}_cuda_ort.cpp ${op}_torch.cpp ${op}_cuda_torch.cpp ${op}_py.cpp)
    if(EXISTS "${dir}/${f}")
      list(APPEND hand_written "${f}")
    endif()
  endforeach()
  if(hand_written)
    list(JOIN hand_written ", " hand_written)
    message(FATAL_ERROR "opbridge_add_op(${op}): ${dir} holds adapters written by hand (${hand_written}), "
                        "which this opbridge no longer builds: its generic adapters serve the op's compute "
                        "functions (OPBRIDGE_KERNEL) in torch, ONNX Runtime and opbridge._core. Delete them "
                        "(opbridge's CHANGELOG.md, \"one generation of APIs\", says how such a project moves)")
  endif()

  # ---- torch: derived, in the library's torch library ----
  get_target_property(lib_no_torch ${lib}_ort OPBRIDGE_NO_TORCH)
  if(NOT arg_NO_TORCH AND NOT lib_no_torch AND NOT TARGET ${lib}_torch)
    # A project without torch builds the ORT library alone.
    _opbridge_make_torch(${lib} ${op} made)
  endif()

  # ---- CUDA ----
  if(NOT with_cuda)
    get_target_property(made_here ${lib}_ort OPBRIDGE_MADE_HERE)
    if(made_here AND EXISTS "${cu}")
      message(STATUS "opbridge_add_op(${op}): CUDA is not enabled in this project; CUDA sources skipped")
    endif()
    return()
  endif()
  set(cuda_kernels ${kernels})
  if(TARGET ${lib}_cuda_kernels)
    set(cuda_kernels ${lib}_cuda_kernels)  # opbridge's own: own architectures, default-stream check
  else()
    _opbridge_link_cudart(${lib})
  endif()
  if(EXISTS "${cu}")
    target_sources(${cuda_kernels} PRIVATE "${cu}")
  endif()
  # The default-stream check (opbridge's superbuild: the property exists) reads the op's folder.
  get_target_property(checked ${cuda_kernels} OPBRIDGE_CHECKED_DIRS)
  if(checked)
    set_property(TARGET ${cuda_kernels} APPEND PROPERTY OPBRIDGE_CHECKED_DIRS "${dir}")
  endif()
endfunction()
