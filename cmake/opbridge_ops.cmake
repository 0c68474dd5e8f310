# opbridge_add_op(<name>): adds one op's sources to every target, by the naming convention
#   cpp/ops/<name>/<name>_cpu.cpp    framework-free CPU kernel        -> opbridge_kernels
#   cpp/ops/<name>/<name>_ort.cpp    ORT CPU op                       -> opbridge_ort
#   cpp/ops/<name>/<name>_torch.cpp  torch schema + CPU impl          -> opbridge_torch
#   cpp/ops/<name>/<name>_py.cpp     numpy binding (optional)         -> _core
#   cuda/ops/<name>/<name>_kernel.cu CUDA launcher (optional)         -> opbridge_cuda_kernels
#   cuda/ops/<name>/<name>_ort.cpp   ORT CUDA op (optional)           -> opbridge_ort
#   cuda/ops/<name>/<name>_torch.cpp torch CUDA impl (optional)       -> opbridge_torch (CUDA torch)
# Registration is static (each file registers itself), so nothing else needs editing.
function(opbridge_add_op name)
  set(cpu ${PROJECT_SOURCE_DIR}/cpp/ops/${name})
  set(gpu ${PROJECT_SOURCE_DIR}/cuda/ops/${name})
  if(NOT EXISTS ${cpu}/${name}_cpu.cpp)
    message(FATAL_ERROR "opbridge_add_op(${name}): ${cpu}/${name}_cpu.cpp does not exist")
  endif()
  target_sources(opbridge_kernels PRIVATE ${cpu}/${name}_cpu.cpp)
  target_sources(opbridge_ort PRIVATE ${cpu}/${name}_ort.cpp)
  if(TARGET opbridge_torch)
    target_sources(opbridge_torch PRIVATE ${cpu}/${name}_torch.cpp)
  endif()
  if(TARGET _core AND EXISTS ${cpu}/${name}_py.cpp)
    target_sources(_core PRIVATE ${cpu}/${name}_py.cpp)
  endif()
  if(OPBRIDGE_CUDA_ENABLED AND EXISTS ${gpu}/${name}_kernel.cu)
    target_sources(opbridge_cuda_kernels PRIVATE ${gpu}/${name}_kernel.cu)
    # The default-stream check re-runs when any of the op's CUDA files changes.
    foreach(f ${name}.cuh ${name}_kernel.cu ${name}_ort.cpp ${name}_torch.cpp)
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
