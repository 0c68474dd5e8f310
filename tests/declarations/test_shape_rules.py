"""Output rules of declarations: parsed and evaluated by the C++ declaration code (the kernels,
ORT's shape inference, check_call) and by the Python evaluator (fake kernels, ONNX inference,
TorchScript), both compared with Python's own arithmetic on random expressions, plus the errors
of rules that do not parse and of calls whose sizes come out negative.

tests/declarations/shape_rules/shape_rules.cpp is compiled against the installed package's headers and its
libopbridge_kernels.a (a second; no CMake)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

import opbridge
from opbridge._declarations import eval_dim

HERE = Path(__file__).parent / "shape_rules"


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++")
    root = Path(opbridge.__file__).parent
    exe = tmp_path_factory.mktemp("rules") / "shape_rules"
    subprocess.run([gxx, "-std=c++17", "-O1", f"-I{root / 'include'}", str(HERE / "shape_rules.cpp"),
                    str(root / "lib" / "libopbridge_kernels.a"), "-pthread", "-o", str(exe)], check=True)
    return exe


def run(probe: Path, rule: str, x: list[int], k: int = 2, stride: int = 1, kernel: list[int] | None = None) -> dict:
    extra = [] if kernel is None else ["kernel=" + ",".join(map(str, kernel))]
    out = subprocess.run([str(probe), rule, *map(str, x), f"k={k}", f"stride={stride}", *extra], capture_output=True,
                         text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        key, _, value = line.partition(": ")
        result[key.rstrip(":")] = value.strip()
    return result


def postfix(text: str) -> list[tuple]:
    dims = [d.split() for d in text.split("|")[:-1]]
    return [tuple(tuple(int(v) for v in step.split(",")) for step in d) for d in dims]


def random_expr(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.35:
        return rng.choice([str(rng.randrange(0, 9)), f"x[{rng.choice([0, 1, -1])}]", "y[0]", "y[1]", "k", "stride"])
    op = rng.choice(["+", "-", "*", "//", "%"])
    left, right = random_expr(rng, depth + 1), random_expr(rng, depth + 1)
    text = f"{left} {op} {right}"
    return f"({text})" if rng.random() < 0.5 else text


def python_value(expr: str, x: list[int], k: int, stride: int):
    """Python's own arithmetic on the rule's text (the grammar is a subset of Python's)."""
    try:
        return eval(expr, {"__builtins__": {}}, {"x": x, "y": [3, 5], "k": k, "stride": stride})
    except ZeroDivisionError:
        return "div0"


def test_random_rules_agree_with_python(probe):
    rng = random.Random()  # fresh expressions every run
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    checked = {"value": 0, "negative": 0, "div0": 0}
    for _ in range(60):
        exprs = [random_expr(rng) for _ in range(rng.randrange(1, 4))]
        x = [rng.randrange(1, 40), rng.randrange(1, 40)]
        k, stride = rng.randrange(-3, 9), rng.randrange(0, 5)
        rule = ", ".join(exprs)
        got = run(probe, rule, x, k, stride)
        assert "declaration error" not in got, (seed, rule, got)
        want = [python_value(e, x, k, stride) for e in exprs]
        parsed = postfix(got["postfix"])
        # The first dimension in error decides the message (check_call reads them in order).
        bad = next((v for v in want if v == "div0" or v < 0), None)
        if bad == "div0":
            checked["div0"] += 1
            assert got.get("call error", "").endswith("divides by zero"), (seed, rule, x, k, stride, got)
        elif bad is not None:
            checked["negative"] += 1
            assert got.get("call error", "").endswith(f"gives {bad}, a size must be >= 0"), (seed, rule, got)
        else:
            checked["value"] += 1
            assert got["shape"] == " ".join(map(str, want)), (seed, rule, x, k, stride, got)
            # The Python evaluator (fake kernels, ONNX inference) on the same postfix form.
            attrs = [k, stride]
            assert [eval_dim(e, lambda i, d, x=x: (x if i == 0 else [3, 5])[d], attrs.__getitem__) for e in parsed] == want
    assert checked["value"] > 5 and checked["negative"] + checked["div0"] > 0, (seed, checked)


def test_unknown_sizes_stay_unknown(probe):
    assert run(probe, "x[0] * 2, x[1] // stride + k", [-1, 9], 2, 2)["shape"] == "-1 6"
    # A known zero divisor is an error even where the dividend is unknown.
    assert run(probe, "x[0] // stride", [-1, 9], 2, 0)["call error"].endswith("divides by zero")
    (e,) = postfix(run(probe, "x[0] // stride", [4, 9])["postfix"])
    assert eval_dim(e, lambda i, d: None, lambda i: 3) is None


@pytest.mark.parametrize("rule, position, what", [
    ("num, x[0]", 0, "'num' is neither an input nor an attribute of op probe"),
    ("x[0], x[1", 9, "expected ']'"),
    ("x[0] / 2", 5, "'/' is not an operator of shape rules (use // for floor division)"),
    ("eps", 0, "attribute eps is a float, a size needs an int attribute"),
    ("x, 4", 1, "input x needs a dimension, e.g. x[0]"),
    ("(x[0] + 1", 9, "expected ')'"),
    ("x[0] +", 6, "expected a size, got the end"),
    ("x[0] 4", 5, "expected ',', an operator or the end"),
])
def test_rules_that_do_not_parse_name_the_position(probe, rule, position, what):
    got = run(probe, rule, [2, 3])["declaration error"]
    assert got.startswith(f"op probe: output out: cannot read shape rule '{rule}' at position {position}: {what} ("), got


def test_an_input_name_alone_is_its_shape(probe):
    got = run(probe, "x", [4, 7, 2])
    assert got["postfix"] == "" and got["shape"] == "4 7 2"
    assert run(probe, "x[0],\tx[1] *\t2", [4, 7])["shape"] == "4 14"  # tabs are spaces


def test_an_output_shape_function_replaces_the_rule(probe):
    # OpDecl::output_shape_fn: for shapes no rule describes (kernels' ctx.output(index), ORT inference).
    assert run(probe, "fn:?, x[1]", [4, 7])["shape"] == "40 7"
    assert run(probe, "fn:x", [-1, 7])["shape"] == "-1 7"


@pytest.mark.parametrize("rule,x,kernel,verdict", [
    ("?, x[1]", [4, 7], [3, 7], "ok"),
    ("?, x[1]", [4, 7], [0, 7], "ok"),
    ("?, x[1]", [4, 7], [3, 6], "output out (rule '?, x[1]') dimension 1 must be 7, got 6"),
    ("?, x[1]", [4, 7], [3], "output out (rule '?, x[1]') needs rank 2, got rank 1"),
    ("?, x[1]", [4, 7], [-1, 7], "output out (rule '?, x[1]') dimension 0 must be >= 0, got -1"),
    ("x[0], x[1]", [4, 7], [4, 7], "output out (rule 'x[0], x[1]') is allocated by the adapter (its rule has no '?'): "
                                   "use out<T>(0)"),
])
def test_an_output_the_kernel_sizes_must_fit_its_rule(probe, rule, x, kernel, verdict):
    # KernelCall::out(i, shape): a compute function allocates a '?' output; the generic adapters
    # (torch, ORT, _core) refuse a shape that contradicts the rule with check_kernel_shape's verdict.
    got = run(probe, rule, x, kernel=kernel)
    assert got["sized by kernel"] == ("1" if "?" in rule else "0")
    assert got["kernel shape"] == verdict
    # The adapters' bookkeeping: the same verdict; allocated once, never twice; one the kernel
    # sizes and leaves out is named when it returns.
    left_out = "the compute function returned without allocating output out (KernelCall::out(i, shape))"
    assert got["missing before"] == (left_out if "?" in rule else "none")
    if verdict == "ok":
        assert got["allocate"] == "ok" and got["missing after"] == "none"
        assert got["allocate again"] == "the compute function's output out is allocated twice"
    else:
        assert got["allocate"] == got["allocate again"] == "the compute function's " + verdict
        assert got["missing after"] == got["missing before"]
