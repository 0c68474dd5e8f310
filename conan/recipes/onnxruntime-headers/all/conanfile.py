"""ONNX Runtime C/C++ API headers (no library), for opbridge's local recipe index.

The recipe version is the ORT version of the headers. Option `source`:
  tarball  official release tarball onnxruntime-linux-x64-<ver>.tgz, its include/
           (GitHub; URL/sha256 in conandata.yml, or conf user.opbridge:ort_tarball_url
           [+ user.opbridge:ort_tarball_sha256] for a mirror)
  npm      `npm pack com.github.asus4.onnxruntime@0.4.9` (~150 MB, in a temp dir that is
           deleted afterwards): package/Plugins/Android/onnxruntime.aar is the official
           ORT 1.29.0 Android AAR, whose zip member headers/* holds the headers
  local    copy the headers from option include_dir (a folder holding
           onnxruntime_c_api.h, or holding onnxruntime/onnxruntime_c_api.h)
  auto     (default) local if include_dir is set, else tarball if reachable within
           a few seconds, else npm
All headers land flat in include/ (`#include <onnxruntime_cxx_api.h>`).
The source used is recorded in res/opbridge_source.json and, for CMake, in the
variables onnxruntime_headers_SOURCE / onnxruntime_headers_ORIGIN (set by
find_package(onnxruntime_headers CONFIG)); target onnxruntime_headers::onnxruntime_headers.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import urllib.request
import zipfile

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.files import copy, download, rmdir, save
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"

REQUIRED_HEADERS = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_cxx_inline.h",
                    "onnxruntime_float16.h", "onnxruntime_lite_custom_op.h")
HEADER_PATTERNS = ("*.h", "*.inc")  # onnxruntime_experimental_c_api.inc is #included
PROBE_TIMEOUT_S = 4.0  # how long `auto` waits for the tarball URL before using npm
BUILD_MODULE = os.path.join("lib", "cmake", "onnxruntime_headers-opbridge-source.cmake")


def resolve_include_dir(path):
    """The folder that directly holds onnxruntime_c_api.h, or None."""
    path = os.path.abspath(os.path.expanduser(path))
    for cand in (path, os.path.join(path, "onnxruntime")):
        if os.path.isfile(os.path.join(cand, "onnxruntime_c_api.h")):
            return cand
    return None


def local_headers(folder):
    """Sorted names of the top-level header files of folder."""
    import fnmatch
    return sorted(n for n in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, n))
                  and any(fnmatch.fnmatch(n, p) for p in HEADER_PATTERNS))


def _safe_rel(name, prefix):
    """name (an archive member) relative to prefix, or None if outside / unsafe."""
    if not name.startswith(prefix):
        return None
    rel = name[len(prefix):]
    parts = rel.split("/")
    if not rel or rel.endswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    return os.path.join(*parts)


class OnnxRuntimeHeadersConan(ConanFile):
    name = "onnxruntime-headers"
    description = "ONNX Runtime C and C++ API headers (no library)"
    license = "MIT"
    homepage = "https://onnxruntime.ai"
    url = "https://github.com/microsoft/onnxruntime"
    topics = ("onnxruntime", "header-only")
    package_type = "header-library"
    options = {
        "source": ["auto", "tarball", "npm", "local"],
        "include_dir": [None, "ANY"],
    }
    default_options = {"source": "auto", "include_dir": None}

    # ---------------------------------------------------------------- config
    def _include_dir_opt(self, options=None):
        value = (options or self.options).get_safe("include_dir")
        if value is None or value == None:  # noqa: E711 - conan's option object compares to None
            return None
        return str(value) or None

    def _source_opt(self, options=None):
        """The `source` option, with auto + include_dir meaning local."""
        options = options or self.options
        source = str(options.source)
        if source == "auto" and self._include_dir_opt(options):
            return "local"
        return source

    def layout(self):
        basic_layout(self)

    def validate(self):
        source = self._source_opt()
        inc = self._include_dir_opt()
        if source == "local":
            if not inc:
                raise ConanInvalidConfiguration(
                    "onnxruntime-headers: source=local needs -o onnxruntime-headers/*:include_dir=<dir>")
            if not resolve_include_dir(inc):
                raise ConanInvalidConfiguration(
                    f"onnxruntime-headers: include_dir={inc} holds no onnxruntime_c_api.h "
                    "(nor onnxruntime/onnxruntime_c_api.h)")
        elif inc:
            raise ConanInvalidConfiguration(
                f"onnxruntime-headers: include_dir is only used with source=local (source={source})")

    def package_id(self):
        # Header-only: no settings. The source stays in the id (the headers of a tarball,
        # the AAR and a local folder differ in detail); for `local` the id also covers
        # the folder and the content of its headers, so edits there are picked up.
        self.info.settings.clear()
        if self._source_opt(self.info.options) == "local":
            self.info.options.source = "local"
            inc = self._include_dir_opt(self.info.options)
            folder = resolve_include_dir(inc) if inc else None
            digest = hashlib.sha256()
            if folder:
                for name in local_headers(folder):
                    digest.update(name.encode() + b"\0")
                    with open(os.path.join(folder, name), "rb") as f:
                        digest.update(hashlib.sha256(f.read()).digest())
            self.info.options.include_dir = f"{folder or inc}#sha256={digest.hexdigest()[:16]}"
        else:
            self.info.options.rm_safe("include_dir")

    # ----------------------------------------------------------------- build
    def build(self):
        inc = os.path.join(self.build_folder, "include")
        lic = os.path.join(self.build_folder, "licenses")
        rmdir(self, inc)
        rmdir(self, lic)
        source = self._source_opt()
        if source == "local":
            origin = self._from_local(inc, lic)
        elif source == "tarball":
            origin = self._from_tarball(inc, lic, quick=False)
        elif source == "npm":
            origin = self._from_npm(inc, lic)
        else:  # auto
            origin = None
            url = self._tarball_info()["url"]
            ok, why = self._probe(url, PROBE_TIMEOUT_S)
            if ok:
                try:
                    origin = self._from_tarball(inc, lic, quick=True)
                except Exception as e:  # noqa: BLE001 - any failure: fall back to npm
                    self.output.warning(f"Release tarball failed ({e}); trying npm")
                    rmdir(self, inc)
                    rmdir(self, lic)
            else:
                self.output.info(f"Release tarball not reachable ({why}); using npm")
            if origin is None:
                origin = self._from_npm(inc, lic)
            source = origin["source"]

        missing = [h for h in REQUIRED_HEADERS if not os.path.isfile(os.path.join(inc, h))]
        if missing:
            raise ConanException(f"onnxruntime-headers ({source}): missing {', '.join(missing)} in "
                                 f"{origin['from']}")
        api = None
        with open(os.path.join(inc, "onnxruntime_c_api.h"), encoding="utf-8", errors="replace") as f:
            m = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", f.read())
            api = int(m.group(1)) if m else None
        expected = int(str(self.version).split(".")[1])
        if api != expected:
            self.output.warning(f"Headers from {origin['from']} have ORT_API_VERSION {api}, but this "
                                f"package is onnxruntime-headers/{self.version} (API {expected})")
        origin.update(version=str(self.version), ort_api_version=api,
                      headers=sorted(os.listdir(inc)))
        save(self, os.path.join(self.build_folder, "opbridge_source.json"),
             json.dumps(origin, indent=1) + "\n")
        save(self, os.path.join(self.build_folder, BUILD_MODULE),
             "# Written by the onnxruntime-headers recipe: where the headers came from.\n"
             f"set(onnxruntime_headers_SOURCE \"{source}\")\n"
             f"set(onnxruntime_headers_ORIGIN [=[{origin['from']}]=])\n")
        self.output.info(f"ONNX Runtime headers from {source}: {origin['from']} (API {api})")

    def _tarball_info(self):
        data = dict(self.conan_data["sources"][str(self.version)]["tarball"])
        url = self.conf.get("user.opbridge:ort_tarball_url", check_type=str)
        if url:
            data = {"url": url,
                    "sha256": self.conf.get("user.opbridge:ort_tarball_sha256", check_type=str)}
        return data

    @staticmethod
    def _probe(url, timeout):
        """(reachable, reason): HEAD request, bounded by timeout even if DNS hangs."""
        result = {}

        def run():
            try:
                req = urllib.request.Request(url, method="HEAD")
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    result["ok"] = r.status < 400
                    result["why"] = f"HTTP {r.status}"
            except Exception as e:  # noqa: BLE001
                result["why"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout + 0.5)
        return result.get("ok", False), result.get("why", f"no answer in {timeout:g} s")

    def _from_local(self, inc, lic):
        given = self._include_dir_opt()
        folder = resolve_include_dir(given)
        names = local_headers(folder)
        for name in names:
            shutil.copy2(os.path.join(folder, name), os.path.join(_mkdir(inc), name))
        save(self, os.path.join(lic, "NOTICE"),
             f"ONNX Runtime headers copied from {folder}.\n"
             "ONNX Runtime is MIT-licensed: https://github.com/microsoft/onnxruntime/blob/main/LICENSE\n")
        for name in ("LICENSE", "ThirdPartyNotices.txt"):
            for cand in (os.path.join(folder, name), os.path.join(os.path.dirname(folder), name)):
                if os.path.isfile(cand):
                    shutil.copy2(cand, os.path.join(lic, name))
                    break
        return {"source": "local", "from": folder}

    def _from_tarball(self, inc, lic, quick):
        data = self._tarball_info()
        url = data["url"]
        with tempfile.TemporaryDirectory(prefix="opbridge-ort-tgz-") as tmp:
            archive = os.path.join(tmp, os.path.basename(url.split("?")[0]) or "ort.tgz")
            kwargs = {"retry": 1, "retry_wait": 1} if quick else {}
            download(self, url, archive, sha256=data.get("sha256") or None, **kwargs)
            n = 0
            with tarfile.open(archive, "r:*") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    name = m.name.lstrip("./")
                    root, _, rest = name.partition("/")
                    rel = _safe_rel(rest, "include/")
                    if rel:
                        dst = os.path.join(inc, rel)
                    elif rest in ("LICENSE", "ThirdPartyNotices.txt"):
                        dst = os.path.join(lic, rest)
                    else:
                        continue
                    _mkdir(os.path.dirname(dst))
                    with tf.extractfile(m) as src, open(dst, "wb") as out:
                        shutil.copyfileobj(src, out)
                    n += rel is not None
            if not n:
                raise ConanException(f"{url}: no include/ folder in the archive")
        return {"source": "tarball", "from": url}

    def _from_npm(self, inc, lic):
        data = self.conan_data["sources"][str(self.version)]["npm"]
        spec = f"{data['package']}@{data['version']}"
        npm = shutil.which("npm")
        if not npm:
            raise ConanException(
                "onnxruntime-headers: the release tarball is not reachable and `npm` is not on PATH. "
                "Install node/npm, or give the headers yourself: "
                "-o onnxruntime-headers/*:source=local -o onnxruntime-headers/*:include_dir=<dir> "
                "(CMake: -DOPBRIDGE_ORT_INCLUDE_DIR=<dir>)")
        # Everything big (npm's cache, the ~150 MB tarball, the AAR) lives in a temp
        # folder that is removed when done: nothing of it stays in the conan cache.
        with tempfile.TemporaryDirectory(prefix="opbridge-ort-npm-") as tmp:
            cmd = [npm, "pack", spec, "--json", "--ignore-scripts", "--loglevel=error",
                   "--cache", os.path.join(tmp, "npm-cache"), "--pack-destination", tmp]
            self.output.info(f"Running: npm pack {spec} (~150 MB download)")
            proc = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, check=False)
            if proc.returncode != 0:
                raise ConanException(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n"
                                     f"{proc.stderr}\n{proc.stdout[-2000:]}")
            try:
                filename = json.loads(proc.stdout)[0]["filename"]
            except (ValueError, LookupError, TypeError):
                filename = f"{data['package']}-{data['version']}.tgz"
            tgz = os.path.join(tmp, os.path.basename(filename))
            algo, _, want = data["integrity"].partition("-")
            h = hashlib.new(algo)
            with open(tgz, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if base64.b64encode(h.digest()).decode() != want:
                raise ConanException(f"{spec}: integrity mismatch (expected {data['integrity']})")
            shutil.rmtree(os.path.join(tmp, "npm-cache"), ignore_errors=True)

            aar = os.path.join(tmp, "onnxruntime.aar")
            wanted = {data["aar"]: aar}
            wanted.update({p: os.path.join(lic, os.path.basename(p)) for p in data["licenses"]})
            with tarfile.open(tgz, "r:gz") as tf:
                for m in tf:
                    if m.isfile() and m.name in wanted:
                        _mkdir(os.path.dirname(wanted[m.name]))
                        with tf.extractfile(m) as src, open(wanted[m.name], "wb") as out:
                            shutil.copyfileobj(src, out)
            os.remove(tgz)
            if not os.path.isfile(aar):
                raise ConanException(f"{spec}: {data['aar']} not found in the npm tarball")
            n = 0
            with zipfile.ZipFile(aar) as z:
                for zi in z.infolist():
                    rel = _safe_rel(zi.filename, data["aar_headers"])
                    if rel is None or zi.is_dir():
                        continue
                    dst = os.path.join(inc, rel)
                    _mkdir(os.path.dirname(dst))
                    with z.open(zi) as src, open(dst, "wb") as out:
                        shutil.copyfileobj(src, out)
                    n += 1
            if not n:
                raise ConanException(f"{spec}: no {data['aar_headers']}* in {data['aar']}")
        return {"source": "npm", "from": f"npm:{spec} {data['aar']}!{data['aar_headers']}"}

    # --------------------------------------------------------------- package
    def package(self):
        bf = self.build_folder
        copy(self, "*", os.path.join(bf, "include"), os.path.join(self.package_folder, "include"))
        copy(self, "*", os.path.join(bf, "licenses"), os.path.join(self.package_folder, "licenses"))
        copy(self, "opbridge_source.json", bf, os.path.join(self.package_folder, "res"))
        copy(self, BUILD_MODULE, bf, self.package_folder)

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "onnxruntime_headers")
        self.cpp_info.set_property("cmake_target_name", "onnxruntime_headers::onnxruntime_headers")
        self.cpp_info.set_property("cmake_build_modules", [BUILD_MODULE])
        self.cpp_info.includedirs = ["include"]
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []


def _mkdir(path):
    os.makedirs(path, exist_ok=True)
    return path
