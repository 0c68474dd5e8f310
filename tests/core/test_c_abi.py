"""opbridge's C ABI (cpp/include/opbridge/c_abi.h) is written once and served by every binary built
on opbridge from the same core library: the ORT library, the torch library and opbridge._core (which
links opbridge's ops itself). Python's ctypes side (opbridge/_c_abi.py) mirrors its structures and
compares them with each library's OpbridgeAbiLayout() when it loads one. These tests hold the
three together, and show that torch's fake kernels and _core do without the ORT library."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap

import pytest

import opbridge
from opbridge import _c_abi, _declarations, _op_library
from opbridge._library import get_library_path, torch_library_path


def _binaries() -> dict[str, str]:
    """Every binary of opbridge's own library that exports the C ABI, by name."""
    from opbridge import _core

    found = {"ort": get_library_path(), "_core": _core.__file__}
    if torch_library_path() is not None and opbridge.build_info().get("torch_version"):
        found["torch"] = torch_library_path()
    return found


def _load(name: str, path: str) -> ctypes.CDLL:
    if name == "torch":
        pytest.importorskip("torch")  # its libtorch must be loaded first
    return ctypes.CDLL(path)


@pytest.mark.parametrize("name", ["ort", "torch", "_core"])
def test_every_binary_lays_out_the_c_abi_as_the_ctypes_side_does(name):
    binaries = _binaries()
    if name not in binaries:
        pytest.skip(f"this build has no {name} library")
    layout = _c_abi.library_c_abi_layout(_load(name, binaries[name]))
    expected = _c_abi.c_abi_layout()
    assert layout == expected, f"{binaries[name]}: {json.dumps(layout)}\nctypes: {json.dumps(expected)}"
    # Every field of both structures is laid out, none overlapping another.
    for struct in ("OpbridgeTensor", "OpbridgeAttr"):
        fields = layout[struct]["fields"]
        assert [f[0] for f in fields] == [f[0] for f in getattr(_c_abi, struct)._fields_]
        ends = [offset + size for _, offset, size in fields]
        assert all(end <= nxt for end, (_, nxt, _) in zip(ends, fields[1:])) and ends[-1] <= layout[struct]["size"]


def test_every_binary_describes_and_checks_the_ops_alike():
    """The same declarations (byte for byte) and the same verdict on a bad call from each binary."""
    binaries = _binaries()
    if "torch" in binaries:
        pytest.importorskip("torch")  # the torch library's libtorch must be loaded first
    libs = {name: _op_library.OpLibrary(get_library_path(), namespace="opbridge", c_abi_path=path)
            for name, path in binaries.items()}
    described = {name: lib._lib.OpbridgeDescribeOps for name, lib in libs.items()}
    for fn in described.values():
        fn.restype = ctypes.c_char_p
    texts = {name: fn() for name, fn in described.items()}
    assert len(set(texts.values())) == 1, {name: len(t) for name, t in texts.items()}
    assert set(libs["ort"].ops) >= {"group_norm", "inverse", "ms_deform_attn"}
    verdicts = {}
    for name, lib in libs.items():
        op = lib.ops["group_norm"]
        with pytest.raises(_declarations.CheckError) as err:
            op.check([(1, [2, 6, 5]), None, None], {"num_groups": 4})
        verdicts[name] = (err.value.code, err.value.message)
        op.check([(1, [2, 6, 5]), None, None], {"num_groups": 3})  # a valid call passes everywhere
    assert len(set(verdicts.values())) == 1, verdicts
    code, message = next(iter(verdicts.values()))
    assert code == 1 and "num_groups must divide the number of channels" in message, message


def test_a_library_of_another_c_abi_is_refused(monkeypatch):
    # As the ctypes side would see a library built against another opbridge's header.
    monkeypatch.setattr(_c_abi, "C_ABI_VERSION", _c_abi.C_ABI_VERSION + 1)
    with pytest.raises(ValueError, match=r"libopbridge_ort\.so was built with another opbridge's C ABI "
                                         r"\(version \d+; .* has version \d+\): rebuild it"):
        _op_library.OpLibrary(get_library_path())


def test_opbridges_ops_are_read_from_core():
    from opbridge import _core

    lib = _op_library.opbridge_library()
    assert lib.c_abi_path == _core.__file__ and lib.path == get_library_path()


_WITHOUT_ORT = textwrap.dedent("""
    import numpy as np, torch, opbridge, opbridge.ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = opbridge.ops.group_norm(torch.empty(2, 4, 3, 3), 2)
    assert tuple(y.shape) == (2, 4, 3, 3)
    try:
        with FakeTensorMode():
            opbridge.ops.group_norm(torch.empty(2, 4, 3, 3), 3)
        raise SystemExit("the fake kernel accepted num_groups = 3 for 4 channels")
    except ValueError as e:
        assert "num_groups must divide the number of channels" in str(e), e
    x = np.random.default_rng(7).standard_normal((2, 4, 3, 3))
    g = x.reshape(2, 2, -1)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(opbridge._core.group_norm(x, 2), ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(opbridge.ops.group_norm(torch.from_numpy(x), 2).numpy(), ref, rtol=1e-10,
                               atol=1e-10)
    maps = open("/proc/self/maps").read()
    print("ort library loaded:", "libopbridge_ort.so" in maps)
""")


def test_the_torch_side_and_core_need_no_ort_library():
    """Fake kernels (the declaration's checks, through the C ABI), eager torch ops and _core on
    arrays, in a fresh process: the ORT library is never loaded."""
    pytest.importorskip("torch")
    if not opbridge.build_info().get("torch_version"):
        pytest.skip("opbridge was built without torch")
    r = subprocess.run([sys.executable, "-c", _WITHOUT_ORT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ort library loaded: False" in r.stdout, r.stdout
