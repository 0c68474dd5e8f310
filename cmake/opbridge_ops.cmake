# opbridge_add_op(<name>): adds one op's sources to every target, by the naming convention
#   cpp/ops/<name>/<name>_decl.cpp   the op's declaration (op_decl.h)  -> opbridge_kernels
#   cpp/ops/<name>/<name>_cpu.cpp    framework-free CPU kernel        -> opbridge_kernels
#   cpp/ops/<name>/<name>_cpu_avx2.cpp, <name>_cpu_avx512.cpp (optional) the kernel's hot loops
#                                    built with that instruction set   -> opbridge_kernels (x86)
#   cpp/ops/<name>/<name>_ort.cpp    ORT CPU op                       -> opbridge_ort
#   cpp/ops/<name>/<name>_torch.cpp  torch schema + CPU impl          -> opbridge_torch
#   cpp/ops/<name>/<name>_py.cpp     numpy binding (optional)         -> _core
#   cuda/ops/<name>/<name>_kernel.cu CUDA launcher (optional)         -> opbridge_cuda_kernels
#   cuda/ops/<name>/<name>_ort.cpp   ORT CUDA op (optional)           -> opbridge_ort
#   cuda/ops/<name>/<name>_torch.cpp torch CUDA impl (optional)       -> opbridge_torch (CUDA torch)
# Registration is static (each file registers itself), so nothing else needs editing.

# Run-time instruction-set dispatch (x86-64 with GCC or Clang): the *_cpu_<isa>.cpp files are
# compiled with these flags into separately named functions, and opbridge::cpu_isa() picks one
# at run time. Everything else stays at the compiler's baseline (no -march=native: the wheel
# must run on any x86-64 CPU). avx2 = x86-64-v3's vector subset; avx512 = x86-64-v4's.
option(OPBRIDGE_CPU_DISPATCH "Build AVX2 / AVX-512 variants of hot CPU kernels (x86-64)" ON)
set(OPBRIDGE_X86_DISPATCH OFF)
if(OPBRIDGE_CPU_DISPATCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$"
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(OPBRIDGE_X86_DISPATCH ON)
  set(OPBRIDGE_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
  set(OPBRIDGE_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c)
endif()
function(opbridge_add_op name)
  set(cpu ${PROJECT_SOURCE_DIR}/cpp/ops/${name})
  if(NOT EXISTS ${cpu}/${name}_cpu.cpp)
    message(FATAL_ERROR "opbridge_add_op(${name}): ${cpu}/${name}_cpu.cpp does not exist")
  endif()
  target_sources(opbridge_kernels PRIVATE ${cpu}/${name}_cpu.cpp)
  if(EXISTS ${cpu}/${name}_decl.cpp)
    target_sources(opbridge_kernels PRIVATE ${cpu}/${name}_decl.cpp)
  endif()
  if(OPBRIDGE_X86_DISPATCH)
    foreach(isa avx2 avx512)
      set(src ${cpu}/${name}_cpu_${isa}.cpp)
      if(EXISTS ${src})
        target_sources(opbridge_kernels PRIVATE ${src})
        set_source_files_properties(${src} TARGET_DIRECTORY opbridge_kernels
                                    PROPERTIES COMPILE_OPTIONS "${OPBRIDGE_ISA_FLAGS_${isa}}")
      endif()
    endforeach()
  endif()
  target_sources(opbridge_ort PRIVATE ${cpu}/${name}_ort.cpp)
  if(TARGET opbridge_torch)
    target_sources(opbridge_torch PRIVATE ${cpu}/${name}_torch.cpp)
  endif()
  if(TARGET _core AND EXISTS ${cpu}/${name}_py.cpp)
    target_sources(_core PRIVATE ${cpu}/${name}_py.cpp)
  endif()
  opbridge_add_cuda_op(${name})
endfunction()

# opbridge_add_cuda_op(<name>): only the CUDA part of opbridge_add_op (the files under
# cuda/ops/<name>/, when CUDA is enabled); opbridge_add_op(<name>) calls it.
function(opbridge_add_cuda_op name)
  set(gpu ${PROJECT_SOURCE_DIR}/cuda/ops/${name})
  if(OPBRIDGE_CUDA_ENABLED AND EXISTS ${gpu}/${name}_kernel.cu)
    target_sources(opbridge_cuda_kernels PRIVATE ${gpu}/${name}_kernel.cu)
    # The default-stream check re-runs when any of the op's CUDA files changes.
    foreach(f ${name}.cuh ${name}_math.cuh ${name}_nhwc.cuh ${name}_kernel.cu ${name}_ort.cpp ${name}_torch.cpp)
      if(EXISTS ${gpu}/${f})
        set_property(TARGET opbridge_cuda_kernels APPEND PROPERTY OPBRIDGE_CHECKED_SOURCES ${gpu}/${f})
      endif()
    endforeach()
    if(EXISTS ${gpu}/${name}_ort.cpp)
      target_sources(opbridge_ort PRIVATE ${gpu}/${name}_ort.cpp)
    endif()
    if(TARGET opbridge_torch AND OPBRIDGE_TORCH_HAS_CUDA AND EXISTS ${gpu}/${name}_torch.cpp)
      target_sources(opbridge_torch PRIVATE ${gpu}/${name}_torch.cpp)
    endif()
  endif()
endfunction()
