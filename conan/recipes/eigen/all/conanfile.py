"""Eigen 3.4.x, header-only, for opbridge's local recipe index.

Where the headers come from, first match wins (the match must be the exact
version being packaged):
  1. the `cmeel-eigen` PyPI package of the Python that runs conan
     (<entry of sys.path>/cmeel.prefix/include/eigen3),
  2. Debian's libeigen3-dev (/usr/include/eigen3),
  3. the upstream tarball from gitlab.com (conandata.yml; needs network).
The origin is recorded in res/opbridge_source.json of the package.

CMake: find_package(Eigen3 CONFIG REQUIRED) -> target Eigen3::Eigen,
include dir <pkg>/include/eigen3 so that `#include <Eigen/Dense>` works.
"""
import json
import os
import re
import sys

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.files import copy, get, save
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"

DEBIAN_EIGEN = "/usr/include/eigen3"


def eigen_header_version(eigen3_dir):
    """'3.4.1' from <eigen3_dir>/Eigen/src/Core/util/Macros.h, or None."""
    macros = os.path.join(eigen3_dir, "Eigen", "src", "Core", "util", "Macros.h")
    try:
        with open(macros, encoding="utf-8", errors="replace") as f:
            text = f.read(20000)
    except OSError:
        return None
    parts = []
    for what in ("WORLD", "MAJOR", "MINOR"):
        m = re.search(r"#define\s+EIGEN_%s_VERSION\s+(\d+)" % what, text)
        if not m:
            return None
        parts.append(m.group(1))
    return ".".join(parts)


def local_eigen_installs():
    """[(origin, eigen3_dir, version)] of the offline sources, in preference order."""
    found, seen = [], set()
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        inc = os.path.join(os.path.abspath(entry), "cmeel.prefix", "include", "eigen3")
        real = os.path.realpath(inc)
        if real in seen or not os.path.isfile(os.path.join(inc, "Eigen", "Dense")):
            continue
        seen.add(real)
        found.append(("cmeel-eigen", inc, eigen_header_version(inc)))
    if os.path.isfile(os.path.join(DEBIAN_EIGEN, "Eigen", "Dense")):
        found.append(("debian", DEBIAN_EIGEN, eigen_header_version(DEBIAN_EIGEN)))
    return found


class EigenConan(ConanFile):
    name = "eigen"
    description = "Eigen: C++ template library for linear algebra (header-only)"
    license = ("MPL-2.0", "LGPL-3.0-or-later")  # a few unsupported/ files are LGPL/BSD
    homepage = "https://eigen.tuxfamily.org"
    url = "https://gitlab.com/libeigen/eigen"
    topics = ("linear-algebra", "header-only")
    package_type = "header-library"
    no_copy_source = True

    def layout(self):
        basic_layout(self, src_folder="src")

    def package_id(self):
        self.info.clear()

    def source(self):
        want = str(self.version)
        for origin, inc, version in local_eigen_installs():
            if version != want:
                self.output.info(f"Not using {origin} at {inc}: it holds Eigen {version}, "
                                 f"not {want}")
                continue
            self.output.info(f"Eigen {want} headers from {origin}: {inc}")
            self._copy_headers(inc, self.source_folder)
            licenses = os.path.join(self.source_folder, "licenses")
            if origin == "debian":
                copy(self, "copyright", "/usr/share/doc/libeigen3-dev", licenses)
            save(self, os.path.join(licenses, "NOTICE"),
                 f"Eigen {want} headers copied from {origin} ({inc}).\n"
                 "Eigen is licensed under the MPL-2.0 (https://www.mozilla.org/MPL/2.0/);\n"
                 "see https://gitlab.com/libeigen/eigen/-/tree/3.4/ for the COPYING.* files.\n")
            self._record(origin, inc)
            return

        data = self.conan_data.get("sources", {}).get(want)
        if not data:
            raise ConanException(f"eigen/{want}: no offline copy found (cmeel-eigen in this Python, "
                            f"or {DEBIAN_EIGEN}) and no upstream URL in conandata.yml")
        self.output.info(f"No offline Eigen {want} (pip install cmeel-eigen=={want}, or Debian's "
                         f"libeigen3-dev); downloading {data['url']}")
        upstream = os.path.join(self.source_folder, "_upstream")
        get(self, **data, destination=upstream, strip_root=True)
        self._copy_headers(upstream, self.source_folder)
        copy(self, "COPYING.*", upstream, os.path.join(self.source_folder, "licenses"))
        self._record("upstream-tarball", data["url"])

    def _copy_headers(self, eigen3_dir, dst):
        # Same layout as an installed include/eigen3 folder.
        copy(self, "*", os.path.join(eigen3_dir, "Eigen"), os.path.join(dst, "Eigen"),
             excludes=("CMakeLists.txt",))
        copy(self, "*", os.path.join(eigen3_dir, "unsupported", "Eigen"),
             os.path.join(dst, "unsupported", "Eigen"), excludes=("CMakeLists.txt",))
        copy(self, "signature_of_eigen3_matrix_library", eigen3_dir, dst)

    def _record(self, origin, where):
        save(self, os.path.join(self.source_folder, "opbridge_source.json"),
             json.dumps({"source": origin, "from": where, "version": str(self.version)},
                        indent=1) + "\n")

    def build(self):
        pass  # header-only

    def package(self):
        src = self.source_folder
        inc = os.path.join(self.package_folder, "include", "eigen3")
        copy(self, "*", os.path.join(src, "Eigen"), os.path.join(inc, "Eigen"))
        copy(self, "*", os.path.join(src, "unsupported"), os.path.join(inc, "unsupported"))
        copy(self, "signature_of_eigen3_matrix_library", src, inc)
        copy(self, "*", os.path.join(src, "licenses"), os.path.join(self.package_folder, "licenses"))
        copy(self, "opbridge_source.json", src, os.path.join(self.package_folder, "res"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "Eigen3")
        self.cpp_info.set_property("cmake_target_name", "Eigen3::Eigen")
        self.cpp_info.set_property("pkg_config_name", "eigen3")
        self.cpp_info.includedirs = ["include/eigen3"]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
