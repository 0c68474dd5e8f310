"""opbridge's C++ dependencies, provided by conan from the repo's own recipe index (conan/).

Normally run by cmake/opbridge_deps.cmake during the CMake configure step. By hand:

    CONAN_HOME=$PWD/.conan-home python -m conans.conan install . -r opbridge \
        -pr:a conan/profiles/linux -s:a build_type=Release --build=missing \
        --output-folder build/conan \
        [-o onnxruntime-headers/*:source=auto|tarball|npm|local] \
        [-o onnxruntime-headers/*:include_dir=/path/to/ort/include]

Only CMakeDeps is generated: the CMake toolchain comes from scikit-build-core.
"""
import os
import re
import sys

import yaml

from conan import ConanFile

ORT_HEADERS = "onnxruntime-headers/1.29.0"


def _eigen_header_version(eigen3_dir):
    macros = os.path.join(eigen3_dir, "Eigen", "src", "Core", "util", "Macros.h")
    try:
        with open(macros, encoding="utf-8", errors="replace") as f:
            text = f.read(20000)
    except OSError:
        return None
    parts = [re.search(r"#define\s+EIGEN_%s_VERSION\s+(\d+)" % w, text) for w in
             ("WORLD", "MAJOR", "MINOR")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def _offline_eigen_versions():
    """Eigen versions available offline, in the eigen recipe's order of preference:
    cmeel-eigen of this Python (sys.path/cmeel.prefix), then Debian's /usr/include/eigen3."""
    dirs = [os.path.join(p, "cmeel.prefix", "include", "eigen3") for p in sys.path if p]
    dirs.append("/usr/include/eigen3")
    return [v for v in (_eigen_header_version(d) for d in dirs) if v]


class OpbridgeDeps(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps"
    virtualbuildenv = False  # no conanbuild.sh/conanrun.sh: nothing here runs tools from conan
    virtualrunenv = False

    def _eigen_version(self):
        # Pick the Eigen version (3.4.x) that can be packaged offline here, so that
        # no download is needed; else the newest one of the recipe index (download).
        with open(os.path.join(self.recipe_folder, "conan", "recipes", "eigen", "config.yml")) as f:
            known = [str(v) for v in yaml.safe_load(f)["versions"]]
        for version in _offline_eigen_versions():
            if version in known:
                return version
        return max(known, key=lambda v: tuple(int(x) for x in v.split(".")))

    def requirements(self):
        self.requires(f"eigen/{self._eigen_version()}")
        self.requires(ORT_HEADERS)
