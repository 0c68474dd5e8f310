# opbridge_package.cmake - the installed CMake package for C++ consumers.
#
# Included at the end of the top-level CMakeLists.txt, after every target exists. Installs,
# under the wheel's opbridge/ package (OPBRIDGE_INSTALL_PKGDIR):
#   libopbridge_ort.so                opbridge::ort (also what opbridge.get_library_path() returns)
#   include/opbridge/*.h              framework-free kernel headers and the ops' headers
#                                     (ops/<op>/<op>.h)                      -> opbridge::kernels
#   include/opbridge/ort/*.h          ORT adapter layer + RegisterCustomOps   -> opbridge::ort_adapter
#   include/opbridge/torch/*.h        torch adapter helpers                  -> opbridge::torch_adapter
#   include/onnxruntime/              the ORT C/C++ API headers the library was built against, with
#                                     ORT's LICENSE                          -> opbridge::onnxruntime_headers
#   lib/libopbridge_*.a               kernels, the core library (opbridge's C ABI,
#                                     <opbridge/c_abi.h>: opbridge::core) and the adapters (static,
#                                     position-independent)
#   bin/opbridge_check_declarations   the build's check of a library's declarations
#                                                                            -> opbridge::check_declarations
#   share/cmake/opbridge/             opbridgeConfig.cmake (+ version, targets), opbridge_add_op(),
#                                     opbridge_find_torch()
# Every path in the installed files is relative to the file's own location, so the package can
# be moved (a wheel installs anywhere). find_package(opbridge CONFIG) finds it through
# opbridge.cmake_dir(), `python -m opbridge --cmake-dir`, or with opbridge's package folder (or
# site-packages) on CMAKE_PREFIX_PATH, which scikit-build-core adds through the cmake.prefix
# entry point.
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)

set(_pkg "${OPBRIDGE_INSTALL_PKGDIR}")
set(_cmakedir "${_pkg}/share/cmake/opbridge")

# ---- exported names and install-time usage requirements ------------------------------------
# The ORT headers as an exported target: conan's target while building, the installed copy after.
add_library(opbridge_onnxruntime_headers INTERFACE)
target_link_libraries(opbridge_onnxruntime_headers INTERFACE
  $<BUILD_INTERFACE:onnxruntime_headers::onnxruntime_headers>)
target_include_directories(opbridge_onnxruntime_headers INTERFACE
  $<INSTALL_INTERFACE:${_pkg}/include/onnxruntime>)
target_link_libraries(opbridge_ort_adapter PUBLIC opbridge_onnxruntime_headers)

# Programs linking the ORT library get RegisterCustomOps' declaration and the ORT headers.
target_include_directories(opbridge_ort INTERFACE $<INSTALL_INTERFACE:${_pkg}/include>)
target_link_libraries(opbridge_ort INTERFACE opbridge_onnxruntime_headers)

# The public headers: C++17, installed under include/ (the adapters get them through kernels).
target_compile_features(opbridge_kernels PUBLIC cxx_std_17)
target_include_directories(opbridge_kernels PUBLIC $<INSTALL_INTERFACE:${_pkg}/include>)

set(_export_targets opbridge_ort opbridge_kernels opbridge_core opbridge_ort_adapter opbridge_onnxruntime_headers
  opbridge_check_declarations)
set_target_properties(opbridge_ort PROPERTIES EXPORT_NAME ort)
set_target_properties(opbridge_check_declarations PROPERTIES EXPORT_NAME check_declarations)
set_target_properties(opbridge_kernels PROPERTIES EXPORT_NAME kernels)
set_target_properties(opbridge_core PROPERTIES EXPORT_NAME core)
set_target_properties(opbridge_ort_adapter PROPERTIES EXPORT_NAME ort_adapter)
set_target_properties(opbridge_onnxruntime_headers PROPERTIES EXPORT_NAME onnxruntime_headers)
if(TARGET opbridge_torch_adapter)
  # torch itself is located in the consumer's project by opbridge_find_torch() (opbridge::torch):
  # the build's torch paths mean nothing after installation.
  target_link_libraries(opbridge_torch_adapter PUBLIC $<INSTALL_INTERFACE:opbridge::torch>)
  set_target_properties(opbridge_torch_adapter PROPERTIES EXPORT_NAME torch_adapter)
  list(APPEND _export_targets opbridge_torch_adapter)
endif()

# ---- files ---------------------------------------------------------------------------------
install(TARGETS ${_export_targets}
  EXPORT opbridgeTargets
  LIBRARY DESTINATION "${_pkg}"
  ARCHIVE DESTINATION "${_pkg}/lib"
  RUNTIME DESTINATION "${_pkg}/bin")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/cpp/include/" DESTINATION "${_pkg}/include"
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
# The ops' headers (opbridge_add_op records each op's ops/<op>/<op>.h) beside them: #include
# <opbridge/group_norm.h>.
get_target_property(_op_headers opbridge_ort OPBRIDGE_OP_HEADERS)
if(_op_headers)
  install(FILES ${_op_headers} DESTINATION "${_pkg}/include/opbridge")
endif()
install(FILES "${PROJECT_SOURCE_DIR}/cpp/ort/ort_op.h" "${PROJECT_SOURCE_DIR}/cpp/ort/register_custom_ops.h"
  DESTINATION "${_pkg}/include/opbridge/ort")
if(TARGET opbridge_torch_adapter)
  install(FILES "${PROJECT_SOURCE_DIR}/cpp/torch/torch_common.h" DESTINATION "${_pkg}/include/opbridge/torch")
endif()

# The ORT headers come from conan at build time (never committed); ship them with their license.
if(NOT onnxruntime_headers_INCLUDE_DIR OR NOT EXISTS "${onnxruntime_headers_INCLUDE_DIR}/onnxruntime_c_api.h")
  message(FATAL_ERROR "opbridge package: no ORT headers at '${onnxruntime_headers_INCLUDE_DIR}' "
                      "(find_package(onnxruntime_headers) must run first)")
endif()
install(DIRECTORY "${onnxruntime_headers_INCLUDE_DIR}/" DESTINATION "${_pkg}/include/onnxruntime")
cmake_path(GET onnxruntime_headers_INCLUDE_DIR PARENT_PATH _ort_pkg)
foreach(_f LICENSE ThirdPartyNotices.txt NOTICE)
  if(EXISTS "${_ort_pkg}/licenses/${_f}")
    install(FILES "${_ort_pkg}/licenses/${_f}" DESTINATION "${_pkg}/include/onnxruntime")
  endif()
endforeach()
file(STRINGS "${onnxruntime_headers_INCLUDE_DIR}/onnxruntime_c_api.h" _line REGEX "^#define ORT_API_VERSION ")
string(REGEX REPLACE "^#define ORT_API_VERSION ([0-9]+).*" "\\1" OPBRIDGE_ORT_API_VERSION "${_line}")

install(EXPORT opbridgeTargets NAMESPACE opbridge:: DESTINATION "${_cmakedir}")
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/opbridgeConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/opbridgeConfig.cmake"
  INSTALL_DESTINATION "${_cmakedir}")
# 0.x: minor versions may break the C++ API (and the static adapters' ABI).
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/opbridgeConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES
  "${CMAKE_CURRENT_BINARY_DIR}/opbridgeConfig.cmake"
  "${CMAKE_CURRENT_BINARY_DIR}/opbridgeConfigVersion.cmake"
  "${CMAKE_CURRENT_LIST_DIR}/opbridge_ops.cmake"
  "${CMAKE_CURRENT_LIST_DIR}/opbridge_find_torch.cmake"
  DESTINATION "${_cmakedir}")
