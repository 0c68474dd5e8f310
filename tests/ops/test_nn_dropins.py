"""opbridge.nn modules are drop-ins for the torch modules they stand in for: every argument of the
twin (as the installed torch has it), the same defaults, our own arguments keyword-only; and
opbridge.nn.convert's report of what it replaced and fused. Runs in every torch of the matrix
(scripts/torch_matrix.sh), where the twin's signature differs between releases."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opbridge.nn  # noqa: E402
from helpers import reference as ref  # noqa: E402

pytestmark = pytest.mark.torch


def test_group_norm_takes_every_argument_of_torchs():
    ours = inspect.signature(opbridge.nn.GroupNorm.__init__).parameters
    twin = inspect.signature(torch.nn.GroupNorm.__init__).parameters
    for name, p in twin.items():
        assert name in ours, f"opbridge.nn.GroupNorm lacks torch.nn.GroupNorm's argument {name!r}"
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name
    extra = [n for n in ours if n not in twin and n != "bias"]
    assert extra == ["activation"]
    assert all(ours[n].kind is inspect.Parameter.KEYWORD_ONLY for n in extra)
    assert ours["bias"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("affine,bias", [(True, False), (True, True), (False, True)])
def test_group_norm_bias_false_like_torch(rng, affine, bias):
    twin_takes_bias = "bias" in inspect.signature(torch.nn.GroupNorm.__init__).parameters
    if not twin_takes_bias:
        if not bias:
            with pytest.raises(TypeError, match="bias"):
                opbridge.nn.GroupNorm(4, 8, affine=affine, bias=bias)
            return
        kwargs = {}
    else:
        kwargs = {"bias": bias}
    ours = opbridge.nn.GroupNorm(4, 8, affine=affine, **kwargs)
    twin = torch.nn.GroupNorm(4, 8, affine=affine, **kwargs)
    assert ours.state_dict().keys() == twin.state_dict().keys()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(p.shape)))
    x = torch.from_numpy(rng.standard_normal((3, 8, 5, 4)) * 2 + 1)
    ours = ours.double()
    w = ours.weight.detach().numpy() if ours.weight is not None else None
    b = ours.bias.detach().numpy() if ours.bias is not None else None
    want = ref.group_norm(x.numpy(), 4, w, b, 1e-5)
    np.testing.assert_allclose(ours(x).detach().numpy(), want, rtol=0, atol=1e-10)


def test_group_norm_activation_is_keyword_only():
    with pytest.raises(TypeError):
        opbridge.nn.GroupNorm(4, 8, 1e-5, True, None, None, "silu")
    assert opbridge.nn.GroupNorm(4, 8, activation="silu").activation == "silu"


def test_convert_reports_what_it_replaced_and_fused():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(4, 8), torch.nn.SiLU(),
                                torch.nn.Sequential(torch.nn.GroupNorm(2, 8)))
    rep = opbridge.nn.convert(model, report=True)
    assert rep.model is model
    assert rep.replaced == [("1", "GroupNorm", "GroupNorm"), ("3.0", "GroupNorm", "GroupNorm")]
    assert isinstance(model[1], opbridge.nn.GroupNorm) and isinstance(model[3][0], opbridge.nn.GroupNorm)
    assert rep.fused == ["1"] and rep.left == []
    text = str(rep)
    assert "replaced 2 modules (GroupNorm x2)" in text and "fused a SiLU into 1 GroupNorm" in text
    assert str(opbridge.nn.convert(torch.nn.Linear(2, 2), report=True)) == "opbridge.nn.convert: nothing to convert"
    again = torch.nn.Sequential(torch.nn.GroupNorm(2, 4))
    assert opbridge.nn.convert(again) is again  # without report=: the model, as before


def test_convert_report_of_a_replaced_root():
    rep = opbridge.nn.convert(torch.nn.GroupNorm(2, 4), report=True)
    assert isinstance(rep.model, opbridge.nn.GroupNorm) and rep.replaced == [("", "GroupNorm", "GroupNorm")]
