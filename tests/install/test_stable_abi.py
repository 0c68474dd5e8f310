"""The torch extension on the LibTorch stable ABI: one binary for every torch from 2.11 on.

Checked here: the library imports no libtorch C++ symbol and names none it could look up (only
the C shim), the torch versions it accepts (older: one ImportError naming both versions; newer
than tested: one warning), the tagged errors (torch.ops and compiled graphs: RuntimeError;
opbridge.ops: the type the tag names, same message), and which torch the optional fast-path
library goes with. scripts/torch_matrix.sh runs this module (and the other torch-side ones) with
one built library in torch 2.11, 2.14 and others.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import opbridge  # noqa: E402
import opbridge.ops  # noqa: E402
from opbridge import _library  # noqa: E402
from opbridge.ops._errors import translated  # noqa: E402

pytestmark = pytest.mark.torch

LIB = opbridge.torch_library_path()
# The C shim's prefixes: every torch symbol the extension uses must be one of these C functions.
SHIM = ("aoti_torch_", "torch_")
# Mangled names of libtorch's C++ namespaces (at::, c10::, torch::).
CXX_TORCH = re.compile(rb"_ZN(K?)(2at|3c10|5torch)")


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"needs {name} (binutils)")
    return path


def _dynamic_symbols(path, *flags):
    out = subprocess.run([_tool("nm"), "-D", *flags, path], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def test_expected_torch():
    # scripts/torch_matrix.sh says which torch each of its venvs must have.
    want = os.environ.get("OPBRIDGE_EXPECT_TORCH")
    if want:
        assert torch.__version__.split("+")[0] == want


def test_imports_no_libtorch_cxx_symbol():
    undefined = _dynamic_symbols(LIB, "--undefined-only")
    torch_cxx = [s for s in undefined if CXX_TORCH.match(s.encode())]
    assert torch_cxx == []
    # Everything else it takes from torch is a C function of the shim (libtorch_cpu exports them).
    from_torch = [s.split("@")[0] for s in undefined if "@" not in s and not s.startswith(("_", "__"))]
    assert from_torch and all(s.startswith(SHIM) for s in from_torch), [s for s in from_torch if not s.startswith(SHIM)]
    # It exports no torch C++ symbol either (nothing of torch's could interpose).
    assert [s for s in _dynamic_symbols(LIB, "--defined-only") if CXX_TORCH.match(s.encode())] == []


def test_looks_up_no_libtorch_cxx_symbol(tmp_path):
    # No mangled torch name anywhere in the library but its (local) symbol table, which strip
    # removes: nothing to dlsym. The one name it looks up at run time is a C function.
    stripped = tmp_path / "lib.so"
    subprocess.run([_tool("strip"), "--strip-all", "-o", str(stripped), LIB], check=True)
    data = stripped.read_bytes()
    assert CXX_TORCH.search(data) is None
    assert b"aoti_torch_get_current_cuda_stream" in data or not opbridge.build_info().get("torch_cuda")


def test_links_only_libtorch_cpu():
    out = subprocess.run([_tool("readelf"), "-d", LIB], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"Shared library: \[([^\]]+)\]", out)
    torch_libs = [n for n in needed if n.startswith(("libtorch", "libc10"))]
    assert torch_libs == ["libtorch_cpu.so"]


# ---- versions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["2.10.0", "2.10.1+cu128", "1.13.1", "2.9.0+cpu"])
def test_older_torch_is_one_import_error_naming_both_versions(version):
    with pytest.raises(ImportError) as info:
        _library.check_torch_version(version)
    assert isinstance(info.value, _library.TorchVersionError)
    msg = str(info.value)
    assert version in msg and "torch>=2.11" in msg, msg


@pytest.mark.parametrize("version", ["2.11.0", "2.12.0+cu130", "2.13.0+cpu", "2.14.1"])
def test_supported_torch_is_silent(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _library.check_torch_version(version)


def test_newer_torch_warns_once():
    _library._warn_untested.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _library.check_torch_version("2.15.0")
        _library.check_torch_version("3.0.0")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 2, messages  # one per version, not one per call
    assert "2.15.0" in messages[0] and "2.14" in messages[0]


def test_older_torch_refuses_import_in_a_fresh_process():
    code = ("import torch, warnings; torch.__version__ = '2.10.0+cpu'; warnings.simplefilter('ignore')\n"
            "import opbridge\n"
            "try:\n"
            "    import opbridge.ops\n"
            "    print('IMPORTED')\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert out.startswith("TorchVersionError") and "2.10.0+cpu" in out and "2.11" in out, out


def test_fastpath_goes_with_the_build_torch_only():
    built = opbridge.build_info().get("torch_version", "")
    same = built.split("+")[0] == torch.__version__.split("+")[0]
    assert (_library.fastpath_library_path(torch.__version__) is not None) == (same and not os.environ.get("OPBRIDGE_NO_FASTPATH"))
    assert _library.fastpath_library_path("2.11.0" if not built.startswith("2.11.") else "2.12.0") is None
    assert hasattr(torch.ops.opbridge, "_no_grad_fast_path") == (_library.fastpath_library_path(torch.__version__) is not None)


# ---- errors ------------------------------------------------------------------------------------

def _cases():
    rng = np.random.default_rng()
    x = torch.from_numpy(rng.standard_normal((2, 6, 4)))
    singular = torch.from_numpy(rng.standard_normal((3, 3, 3)))
    singular[1, 2] = singular[1, 0]  # matrix 1: two equal rows (an exact zero pivot)
    return [
        # (torch op call, opbridge.ops call, type, message after the tag)
        (lambda: torch.ops.opbridge.group_norm(x, 4), lambda: opbridge.ops.group_norm(x, 4), ValueError,
         "opbridge::group_norm: num_groups must divide the number of channels C = x.shape[1] = 6, got num_groups = 4"),
        (lambda: torch.ops.opbridge.group_norm(x.int(), 2), lambda: opbridge.ops.group_norm(x.int(), 2), TypeError,
         "opbridge::group_norm: x must be a float32, float64, float16 or bfloat16 tensor, got int32"),
        (lambda: torch.ops.opbridge.inverse(singular), lambda: opbridge.ops.inverse(singular),
         torch.linalg.LinAlgError, "opbridge::inverse: matrix 1 of the batch is singular"),
    ]


@pytest.mark.parametrize("index", range(3))
def test_torch_ops_raise_tagged_runtime_errors_and_opbridge_ops_the_type(index):
    raw, api, exc, message = _cases()[index]
    with pytest.raises(RuntimeError) as info:
        raw()
    assert type(info.value) is RuntimeError
    tag = "LinAlgError" if exc is torch.linalg.LinAlgError else exc.__name__
    assert str(info.value).startswith(f"{tag}: {message}"), str(info.value)
    with pytest.raises(exc) as info2:
        api()
    assert type(info2.value) is exc
    # The same message, less the tag.
    assert str(info2.value) == str(info.value)[len(tag) + 2:]
    assert isinstance(translated(info.value), exc)


def test_untagged_runtime_errors_stay():
    assert translated(RuntimeError("opbridge::inverse: CUDA launch failed")) is None
    assert translated(RuntimeError("KeyError: not one of ours")) is None


def test_compiled_graph_raises_the_tagged_runtime_error():
    # A singular matrix is found by the kernel, at run time: a compiled graph raises what the
    # torch op raises (shape errors come from the fake kernel, when compiling, with their types).
    def f(a):
        return torch.ops.opbridge.inverse(a) * 2

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    a = torch.eye(3).repeat(2, 1, 1)
    assert torch.equal(compiled(a), 2 * a)
    a[1, 0, 0] = 0
    with pytest.raises(RuntimeError, match=r"^LinAlgError: opbridge::inverse: matrix 1 of the batch is singular"):
        compiled(a)
    # (Dynamo reports a fake kernel's error in its own RuntimeError, naming the ValueError.)
    with pytest.raises(RuntimeError, match=r"ValueError\('opbridge::group_norm: num_groups must divide"):
        torch.compile(lambda x: torch.ops.opbridge.group_norm(x, 4), backend="aot_eager")(torch.ones(2, 6, 3))
