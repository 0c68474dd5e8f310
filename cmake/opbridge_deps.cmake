# opbridge_deps.cmake - provide Eigen and the ONNX Runtime headers through conan.
#
# Include right after project() (CMAKE_BUILD_TYPE set, Python found):
#
#   include(cmake/opbridge_deps.cmake)
#   find_package(Eigen3 CONFIG REQUIRED)              # -> Eigen3::Eigen
#   find_package(onnxruntime_headers CONFIG REQUIRED) # -> onnxruntime_headers::onnxruntime_headers
#
# It runs `${Python_EXECUTABLE} -m conans.conan install <repo root>` with the repo's
# recipe index (conan/recipes, a local-recipes-index remote) and profile
# (conan/profiles/linux), writes CMakeDeps files to ${CMAKE_BINARY_DIR}/conan and puts
# that folder first on CMAKE_PREFIX_PATH. Conan only runs again when its inputs change
# (conanfile.py, anything under conan/, options, build type, conan home, python).
#
# Cache variables:
#   OPBRIDGE_ORT_HEADERS_SOURCE  auto|tarball|npm|local (default auto: release tarball if
#                                reachable within a few seconds, else npm)
#   OPBRIDGE_ORT_INCLUDE_DIR     folder with the ORT headers; if set, implies `local`
#   OPBRIDGE_CONAN_HOME          conan home; empty = $ENV{CONAN_HOME}, else
#                                <repo>/.conan-home (keep it outside the build dir so a
#                                clean build does not download the ORT headers again)
#   OPBRIDGE_CONAN_EXTRA_ARGS    extra arguments for `conan install` (a ;-list), e.g. a
#                                mirror of the ORT release tarball:
#                                -c;user.opbridge:ort_tarball_url=<url>;-c;user.opbridge:ort_tarball_sha256=<hex>
# Normal variable (set before the include to override):
#   OPBRIDGE_SOURCE_DIR          repo root holding conanfile.py and conan/ (default: the
#                                parent of this file's folder)
# Results (normal variables): OPBRIDGE_CONAN_OUTPUT_DIR; CMAKE_PREFIX_PATH, Eigen3_DIR,
# onnxruntime_headers_DIR. After find_package(onnxruntime_headers):
# onnxruntime_headers_SOURCE (tarball/npm/local) and onnxruntime_headers_ORIGIN.

include_guard(GLOBAL)
if(CMAKE_VERSION VERSION_LESS 3.20)  # cmake_path, string(JSON)
  message(FATAL_ERROR "opbridge_deps.cmake needs CMake >= 3.20 (this is ${CMAKE_VERSION})")
endif()

function(_opbridge_conan_deps)
  # ---------------------------------------------------------------- inputs
  if(NOT DEFINED OPBRIDGE_SOURCE_DIR OR OPBRIDGE_SOURCE_DIR STREQUAL "")
    cmake_path(GET CMAKE_CURRENT_FUNCTION_LIST_DIR PARENT_PATH OPBRIDGE_SOURCE_DIR)
  endif()
  cmake_path(ABSOLUTE_PATH OPBRIDGE_SOURCE_DIR NORMALIZE)
  string(REGEX REPLACE "/+$" "" src "${OPBRIDGE_SOURCE_DIR}")
  set(index "${src}/conan")
  set(profile "${index}/profiles/linux")
  foreach(f "${src}/conanfile.py" "${profile}")
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "opbridge deps: ${f} not found (OPBRIDGE_SOURCE_DIR=${src})")
    endif()
  endforeach()

  set(OPBRIDGE_ORT_HEADERS_SOURCE "auto" CACHE STRING
      "Where conan gets the ONNX Runtime headers: auto, tarball, npm or local")
  set_property(CACHE OPBRIDGE_ORT_HEADERS_SOURCE PROPERTY STRINGS auto tarball npm local)
  set(OPBRIDGE_ORT_INCLUDE_DIR "" CACHE PATH
      "Folder holding onnxruntime_c_api.h etc.; if set, the ORT headers come from there (local)")
  set(OPBRIDGE_CONAN_HOME "" CACHE PATH
      "Conan home for opbridge's dependencies (empty: \$ENV{CONAN_HOME}, else <repo>/.conan-home)")
  set(OPBRIDGE_CONAN_EXTRA_ARGS "" CACHE STRING "Extra arguments for `conan install` (;-list)")

  set(ort_source "${OPBRIDGE_ORT_HEADERS_SOURCE}")
  set(ort_dir "")
  if(NOT OPBRIDGE_ORT_INCLUDE_DIR STREQUAL "")
    cmake_path(ABSOLUTE_PATH OPBRIDGE_ORT_INCLUDE_DIR OUTPUT_VARIABLE ort_dir NORMALIZE)
    string(REGEX REPLACE "(.)/+$" "\\1" ort_dir "${ort_dir}")
    if(NOT ort_source MATCHES "^(auto|local)$")
      message(WARNING "opbridge deps: OPBRIDGE_ORT_INCLUDE_DIR is set, so the ORT headers come "
                      "from it (local), not from '${ort_source}'")
    endif()
    set(ort_source "local")
  elseif(ort_source STREQUAL "local")
    message(FATAL_ERROR "opbridge deps: OPBRIDGE_ORT_HEADERS_SOURCE=local needs OPBRIDGE_ORT_INCLUDE_DIR")
  endif()
  if(NOT ort_source MATCHES "^(auto|tarball|npm|local)$")
    message(FATAL_ERROR "opbridge deps: OPBRIDGE_ORT_HEADERS_SOURCE='${ort_source}', "
                        "expected auto, tarball, npm or local")
  endif()

  if(NOT OPBRIDGE_CONAN_HOME STREQUAL "")
    set(home "${OPBRIDGE_CONAN_HOME}")
  elseif(DEFINED ENV{CONAN_HOME} AND NOT "$ENV{CONAN_HOME}" STREQUAL "")
    set(home "$ENV{CONAN_HOME}")
  else()
    set(home "${src}/.conan-home")
  endif()
  cmake_path(ABSOLUTE_PATH home NORMALIZE)
  string(REGEX REPLACE "(.)/+$" "\\1" home "${home}")

  if(NOT Python_EXECUTABLE)
    if(Python3_EXECUTABLE)
      set(Python_EXECUTABLE "${Python3_EXECUTABLE}")
    else()
      find_package(Python COMPONENTS Interpreter REQUIRED)
    endif()
  endif()
  set(conan "${Python_EXECUTABLE}" -m conans.conan)

  # Build types: conan must be run with the build type(s) CMake uses, else CMakeDeps'
  # $<CONFIG:...> expressions select nothing and include dirs come out empty. Build types
  # conan does not know are mapped to Release (CMAKE_MAP_IMPORTED_CONFIG_<CFG>).
  if(CMAKE_CONFIGURATION_TYPES)
    set(configs ${CMAKE_CONFIGURATION_TYPES})
  elseif(CMAKE_BUILD_TYPE)
    set(configs "${CMAKE_BUILD_TYPE}")
  else()
    set(configs Release)
    message(STATUS "opbridge deps: CMAKE_BUILD_TYPE is empty; conan uses Release")
  endif()
  set(conan_types "")
  foreach(cfg IN LISTS configs)
    if(cfg MATCHES "^(Debug|Release|RelWithDebInfo|MinSizeRel)$")
      list(APPEND conan_types "${cfg}")
    else()
      string(TOUPPER "${cfg}" ucfg)
      if(NOT DEFINED CMAKE_MAP_IMPORTED_CONFIG_${ucfg})
        set(CMAKE_MAP_IMPORTED_CONFIG_${ucfg} Release PARENT_SCOPE)
      endif()
      list(APPEND conan_types Release)
    endif()
  endforeach()
  list(REMOVE_DUPLICATES conan_types)

  set(out "${CMAKE_BINARY_DIR}/conan")
  set(stamp_file "${out}/opbridge-conan.stamp")
  set(log_file "${out}/opbridge-conan-install.log")

  # ------------------------------------------------- has anything changed?
  file(GLOB_RECURSE index_files LIST_DIRECTORIES false RELATIVE "${index}" "${index}/*")
  list(FILTER index_files EXCLUDE REGEX "(^|/)(__pycache__|\\.[^/]*)(/|$)|\\.py[co]$")
  list(SORT index_files)
  set(inputs "opbridge-deps v1\nsrc=${src}\nhome=${home}\npython=${Python_EXECUTABLE}\n"
             "types=${conan_types}\nort_source=${ort_source}\nort_dir=${ort_dir}\n"
             "extra=${OPBRIDGE_CONAN_EXTRA_ARGS}\n")
  file(SHA256 "${CMAKE_CURRENT_FUNCTION_LIST_FILE}" h)
  string(APPEND inputs "module ${h}\n")
  file(SHA256 "${src}/conanfile.py" h)
  string(APPEND inputs "conanfile.py ${h}\n")
  set(depends "${src}/conanfile.py")
  foreach(f IN LISTS index_files)
    file(SHA256 "${index}/${f}" h)
    string(APPEND inputs "${f} ${h}\n")
    list(APPEND depends "${index}/${f}")
  endforeach()
  if(ort_dir AND IS_DIRECTORY "${ort_dir}")
    file(GLOB ort_headers LIST_DIRECTORIES false "${ort_dir}/*.h" "${ort_dir}/*.inc"
         "${ort_dir}/onnxruntime/*.h" "${ort_dir}/onnxruntime/*.inc")
    list(SORT ort_headers)
    foreach(f IN LISTS ort_headers)
      file(SHA256 "${f}" h)
      string(APPEND inputs "${f} ${h}\n")
    endforeach()
  endif()
  string(SHA256 stamp "${inputs}")
  # Edits of the recipes / conanfile re-run configure (and so conan) on the next build.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${depends})

  set(up_to_date FALSE)
  if(EXISTS "${stamp_file}")
    file(READ "${stamp_file}" old_stamp)
    if(old_stamp STREQUAL stamp)
      set(up_to_date TRUE)
      # The generated files point into the conan cache: check that those folders still exist.
      foreach(bt IN LISTS conan_types)
        string(TOLOWER "${bt}" lbt)
        string(TOUPPER "${bt}" ubt)
        foreach(pkg Eigen3 onnxruntime_headers)
          file(GLOB data "${out}/${pkg}-${lbt}-*-data.cmake")
          if(NOT data)
            set(up_to_date FALSE)
            break()
          endif()
          file(STRINGS "${data}" lines REGEX "_PACKAGE_FOLDER_${ubt} \"")
          foreach(line IN LISTS lines)
            if(line MATCHES "_PACKAGE_FOLDER_${ubt} \"([^\"]*)\"")
              if(NOT IS_DIRECTORY "${CMAKE_MATCH_1}")
                set(up_to_date FALSE)
              endif()
            endif()
          endforeach()
        endforeach()
      endforeach()
    endif()
  endif()

  if(up_to_date)
    message(STATUS "opbridge deps: conan inputs unchanged, using ${out}")
  else()
    file(MAKE_DIRECTORY "${home}" "${out}")
    # One conan at a time per home (parallel configures of several build dirs).
    file(LOCK "${home}/.opbridge.lock" GUARD FUNCTION TIMEOUT 900 RESULT_VARIABLE lock_err)
    if(lock_err)
      message(WARNING "opbridge deps: could not lock ${home}/.opbridge.lock: ${lock_err}")
    endif()
    file(REMOVE "${stamp_file}")
    set(env "${CMAKE_COMMAND}" -E env "CONAN_HOME=${home}" NO_COLOR=1)
    set(log "")

    # The home's remotes: only `opbridge` (this repo's recipe index), never conancenter.
    # A fresh home gets conancenter by default: remove it. An existing home is only
    # (re)pointed at this repo; `-r opbridge` below keeps other remotes out anyway.
    set(remote_ok FALSE)
    if(EXISTS "${home}/remotes.json" AND EXISTS "${home}/.local_recipes_index/opbridge")
      file(READ "${home}/remotes.json" remotes)
      string(JSON n ERROR_VARIABLE jerr LENGTH "${remotes}" remotes)
      if(NOT jerr AND n GREATER 0)
        math(EXPR last "${n} - 1")
        foreach(i RANGE ${last})
          string(JSON name ERROR_VARIABLE jerr GET "${remotes}" remotes ${i} name)
          string(JSON url ERROR_VARIABLE jerr GET "${remotes}" remotes ${i} url)
          string(JSON type ERROR_VARIABLE jerr GET "${remotes}" remotes ${i} remote_type)
          string(JSON disabled ERROR_VARIABLE jerr GET "${remotes}" remotes ${i} disabled)
          if(name STREQUAL "opbridge" AND url STREQUAL index AND type STREQUAL "local-recipes-index"
             AND NOT disabled)
            set(remote_ok TRUE)
          endif()
        endforeach()
      endif()
    endif()
    if(NOT remote_ok)
      if(NOT EXISTS "${home}/remotes.json")
        execute_process(COMMAND ${env} ${conan} remote remove conancenter
                        RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE o)
        string(APPEND log "$ conan remote remove conancenter  -> ${rc}\n${o}\n")
      endif()
      execute_process(COMMAND ${env} ${conan} remote add opbridge "${index}"
                              --type=local-recipes-index --force
                      RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE o)
      string(APPEND log "$ conan remote add opbridge ${index} --type=local-recipes-index --force"
                        "  -> ${rc}\n${o}\n")
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "opbridge deps: could not set up the conan remote in ${home} "
                            "(is conan installed for ${Python_EXECUTABLE}?):\n${log}")
      endif()
    endif()

    set(opts -o "onnxruntime-headers/*:source=${ort_source}")
    if(ort_source STREQUAL "local")
      list(APPEND opts -o "onnxruntime-headers/*:include_dir=${ort_dir}")
    endif()
    string(TIMESTAMP t0 "%s")
    foreach(bt IN LISTS conan_types)
      set(cmd ${conan} install "${src}" -r opbridge --update --build=missing
              -pr:a "${profile}" -s:a "build_type=${bt}" --output-folder "${out}"
              ${opts} ${OPBRIDGE_CONAN_EXTRA_ARGS})
      list(JOIN cmd " " cmd_str)
      message(STATUS "opbridge deps: conan install (${bt}, ORT headers: ${ort_source}), home ${home}")
      execute_process(COMMAND ${env} ${cmd} WORKING_DIRECTORY "${src}"
                      RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE o)
      string(APPEND log "$ ${cmd_str}\n${o}\n-> ${rc}\n")
      file(WRITE "${log_file}" "${log}")
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "opbridge deps: conan install failed (exit ${rc}); log: ${log_file}\n"
                            "CONAN_HOME=${home}\n$ ${cmd_str}\n${o}")
      endif()
    endforeach()
    string(TIMESTAMP t1 "%s")
    math(EXPR dt "${t1} - ${t0}")
    file(WRITE "${stamp_file}" "${stamp}")
    file(WRITE "${out}/opbridge-conan.inputs" "${inputs}")  # to see why conan re-ran
    message(STATUS "opbridge deps: conan done in ~${dt} s (log: ${log_file})")
  endif()

  # ----------------------------------------------------------------- results
  set(OPBRIDGE_CONAN_OUTPUT_DIR "${out}" PARENT_SCOPE)
  set(prefix ${CMAKE_PREFIX_PATH})
  list(REMOVE_ITEM prefix "${out}")
  set(CMAKE_PREFIX_PATH "${out}" ${prefix} PARENT_SCOPE)
  # Beats a stale cache entry (e.g. Eigen3_DIR found elsewhere before).
  set(Eigen3_DIR "${out}" PARENT_SCOPE)
  set(onnxruntime_headers_DIR "${out}" PARENT_SCOPE)
endfunction()

_opbridge_conan_deps()
