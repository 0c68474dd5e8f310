"""opbridge.nn.convert on transformers' ``multi_scale_deformable_attention_v2`` layers (per-level
point counts): RT-DETRv2, D-FINE, DEIMv2. Levels with fewer points than the most are padded with
zero-weight points (opbridge/nn/ms_deform_attn_per_level.py). Checked against a float64 reference built
level by level from tests/helpers/reference.py (no padding involved), against the unconverted modules and
models in float64, and through both exporters and both lowerings in ONNX Runtime."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opbridge  # noqa: E402
import opbridge.nn  # noqa: E402
import opbridge.onnx  # noqa: E402
from helpers import reference  # noqa: E402
from opbridge.nn.ms_deform_attn_per_level import ms_deform_attn_per_level  # noqa: E402

# Non-power-of-two and non-square levels, and a 1 x 1 one.
LEVELS = [(7, 5), (3, 4), (1, 1)]
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "benchmarks"
FAMILIES = {"rt_detr_v2": "RTDetrV2", "d_fine": "DFine", "deimv2": "Deimv2"}


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed (optional: pip install "
                                                      "transformers; it is in the test requirements)")


def _family(family):
    _transformers()
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError as e:  # pragma: no cover - older transformers without this family
        pytest.skip(f"transformers has no {family}: {e}")


def _levels(levels=LEVELS):
    return torch.tensor(levels, dtype=torch.long), [tuple(lv) for lv in levels], sum(h * w for h, w in levels)


def _v2_reference(value, spatial_shapes, locations, weights, num_points_list):
    """float64: each level on its own through reference.ms_deform_attn (one level, its P_l points),
    summed. Nothing is padded here."""
    value, locations, weights = (np.asarray(t, np.float64) for t in (value, locations, weights))
    out, start, first = 0.0, 0, 0
    for (h, w), p in zip(np.asarray(spatial_shapes).tolist(), num_points_list):
        out = out + reference.ms_deform_attn(
            value[:, start:start + h * w], np.array([[h, w]]), np.array([0]),
            locations[:, :, :, None, first:first + p], weights[:, :, :, None, first:first + p])
        start, first = start + h * w, first + p
    return out


@pytest.mark.parametrize("num_points_list", [[3, 6, 3], [1, 4, 2], [2, 2, 2], [5, 1, 1]])
def test_core_against_reference(num_points_list):
    shapes, _, s = _levels()
    n, lq, m, d, p = 2, 9, 3, 5, sum(num_points_list)
    value = torch.randn(n, s, m, d, dtype=torch.float64)
    # Partly and wholly off the maps.
    loc = torch.rand(n, lq, m, p, 2, dtype=torch.float64) * 1.6 - 0.3
    weights = torch.randn(n, lq, m, p, dtype=torch.float64)
    got = ms_deform_attn_per_level(value, shapes, loc, weights, num_points_list)
    np.testing.assert_allclose(got.numpy(), _v2_reference(value, shapes, loc, weights, num_points_list),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["d_fine", "rt_detr_v2"])
def test_core_matches_library_function_with_gradients(family):
    """Against transformers' own v2 function (method="default"), float64, values and all three
    gradients (padded points must not leak into the gradients of the real ones)."""
    lib = _family(family).multi_scale_deformable_attention_v2
    shapes, shapes_list, s = _levels()
    num_points_list = [3, 6, 3]
    value = torch.randn(2, s, 4, 6, dtype=torch.float64, requires_grad=True)
    loc = (torch.rand(2, 7, 4, 12, 2, dtype=torch.float64) * 1.6 - 0.3).requires_grad_()
    weights = torch.randn(2, 7, 4, 12, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(2, 7, 24, dtype=torch.float64)
    expected = lib(value, shapes_list, loc, weights, num_points_list, "default")
    expected_grads = torch.autograd.grad(expected, (value, loc, weights), grad_out)
    got = ms_deform_attn_per_level(value, shapes, loc, weights, num_points_list)
    got_grads = torch.autograd.grad(got, (value, loc, weights), grad_out)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_padding_reads_no_value():
    """A padded point adds exactly 0 even where the map holds inf: with its weight 0 it must not
    sample the map at all (0 * inf = NaN). Level 0 has fewer points than level 1, its map is
    inf and its real points lie off the map; transformers' function gives a finite result."""
    lib = _family("d_fine").multi_scale_deformable_attention_v2
    shapes, shapes_list, s = _levels(LEVELS[:2])
    num_points_list = [2, 4]
    value = torch.randn(1, s, 2, 3, dtype=torch.float64)
    value[:, :35] = float("inf")
    loc = torch.rand(1, 5, 2, 6, 2, dtype=torch.float64)
    loc[:, :, :, :2] -= 2.5  # level 0's points: off the map
    weights = torch.rand(1, 5, 2, 6, dtype=torch.float64)
    expected = lib(value, shapes_list, loc, weights, num_points_list, "default")
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(ms_deform_attn_per_level(value, shapes, loc, weights, num_points_list), expected,
                               rtol=1e-12, atol=1e-12)


# --- the layers, per family ----------------------------------------------------------------------

def _config(family, points, method="default"):
    transformers = _transformers()
    if family == "rt_detr_v2":
        # RT-DETRv2's layer always uses decoder_n_points on every level.
        return transformers.RTDetrV2Config(d_model=32, decoder_attention_heads=4, decoder_n_levels=len(LEVELS),
                                           decoder_n_points=points, decoder_method=method)
    cls = transformers.DFineConfig if family == "d_fine" else transformers.Deimv2Config
    return cls(d_model=32, decoder_attention_heads=4, num_feature_levels=len(LEVELS), decoder_n_points=points,
               decoder_method=method)


def _layer(family, points, method="default"):
    mod = _family(family)
    m = getattr(mod, f"{FAMILIES[family]}MultiscaleDeformableAttention")(_config(family, points, method))
    m = m.double().eval()
    # Spread the points: many land off the maps or on their borders.
    nn.init.normal_(m.sampling_offsets.weight, std=0.3)
    nn.init.uniform_(m.sampling_offsets.bias, -3.0, 3.0)
    return mod, m


def _layer_inputs(family, masked):
    shapes, shapes_list, s = _levels()
    n, q = 2, 6
    hidden = torch.randn(n, q, 32, dtype=torch.float64, requires_grad=True)
    encoder = torch.randn(n, s, 32, dtype=torch.float64, requires_grad=True)
    boxes = torch.cat([torch.rand(n, q, 1, 2, dtype=torch.float64) * 1.2 - 0.1,
                       torch.rand(n, q, 1, 2, dtype=torch.float64) * 0.8 + 0.05], -1)
    kwargs = dict(encoder_hidden_states=encoder, reference_points=boxes, spatial_shapes=shapes,
                  spatial_shapes_list=shapes_list)
    if family == "rt_detr_v2":
        kwargs["position_embeddings"] = torch.randn(n, q, 32, dtype=torch.float64)
        kwargs["level_start_index"] = torch.tensor([0, 35, 47])
        mask_shape = (n, s)  # masks value before the head split
    else:
        mask_shape = (n, s, 1)  # masks value after it (D-FINE's layer has no value projection)
    if masked:
        kwargs["attention_mask"] = torch.rand(mask_shape) > 0.2  # True = keep
    return hidden, kwargs


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("family,points", [("rt_detr_v2", 3), ("d_fine", [3, 5, 2]), ("d_fine", 4),
                                           ("deimv2", [2, 6, 3]), ("deimv2", 3)])
@pytest.mark.parametrize("masked", [False, True])
def test_layer_converted(family, points, masked):
    mod, m = _layer(family, points)
    forward_before = type(m).forward
    function_before = mod.multi_scale_deformable_attention_v2
    hidden, kwargs = _layer_inputs(family, masked)
    calls = []
    m.register_forward_hook(lambda *a: calls.append(1))
    expected = m(hidden, **kwargs)
    params = [hidden, kwargs["encoder_hidden_states"], *m.parameters()]
    grads_out = [torch.randn_like(t) for t in expected]
    expected_grads = torch.autograd.grad(expected, params, grads_out)
    before = _state(m)

    holder = nn.ModuleList([m])
    opbridge.nn.convert(holder)
    new = holder[0]
    assert new is not m and type(new).__module__ == "opbridge.nn.ms_deform_attn_per_level"
    assert list(new.state_dict()) == list(before)
    for k, v in new.state_dict().items():
        assert v.equal(before[k]) and v.data_ptr() == m.state_dict()[k].data_ptr()  # shared, not copied
    got = new(hidden, **kwargs)
    assert len(calls) == 2  # the original's hooks run on the replacement
    assert len(got) == 2
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)
    for g, e in zip(torch.autograd.grad(got, params, grads_out), expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)
    # Nothing outside the model changed.
    assert type(m).forward is forward_before and mod.multi_scale_deformable_attention_v2 is function_before
    assert all(a.equal(b) for a, b in zip(m(hidden, **kwargs), expected))


@pytest.mark.parametrize("family,points", [("rt_detr_v2", 3), ("d_fine", [3, 5, 2])])
def test_layer_hands_the_op_host_tables(monkeypatch, family, points):
    """As the v1 layers (test_ms_deform_attn_convert's host-table test): the op gets level tables
    built from spatial_shapes_list in host memory, cached, not the model's tensor."""
    _, m = _layer(family, points)
    hidden, kwargs = _layer_inputs(family, False)
    holder = nn.ModuleList([m])
    opbridge.nn.convert(holder)
    real, seen = opbridge.ops.ms_deform_attn, []

    def record(value, spatial_shapes, level_start_index, *rest):
        seen.append((spatial_shapes, level_start_index))
        return real(value, spatial_shapes, level_start_index, *rest)

    monkeypatch.setattr(opbridge.ops, "ms_deform_attn", record)
    holder[0](hidden, **kwargs)
    holder[0](hidden, **kwargs)
    (shapes, starts), (shapes2, _) = seen
    assert shapes is shapes2 and shapes is not kwargs["spatial_shapes"] and shapes.device.type == "cpu"
    assert shapes.tolist() == [list(r) for r in kwargs["spatial_shapes_list"]]
    assert starts.tolist() == [0, 35, 47]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layer_checks_and_pickles_as_the_original(family):
    import pickle

    _, m = _layer(family, [2, 3, 1] if family != "rt_detr_v2" else 2)
    hidden, kwargs = _layer_inputs(family, False)
    new = opbridge.nn.convert(m)
    assert type(new).__module__ == "opbridge.nn.ms_deform_attn_per_level"
    # Levels that do not add up to the sequence length: the original's own error, eagerly.
    bad = dict(kwargs, spatial_shapes=kwargs["spatial_shapes"] + 1)
    with pytest.raises(ValueError, match="align the spatial shapes") as original_error:
        m(hidden, **bad)
    with pytest.raises(ValueError, match="align the spatial shapes") as converted_error:
        new(hidden, **bad)
    assert str(converted_error.value) == str(original_error.value)
    again = pickle.loads(pickle.dumps(new))
    for g, e in zip(again(hidden, **kwargs), m(hidden, **kwargs)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_layer_locations_reach_outside_the_maps():
    """The inputs of the layer tests do sample off the maps (else the border arithmetic would go
    untested): the locations the D-FINE layer hands to the core."""
    mod, m = _layer("d_fine", [3, 5, 2])
    hidden, kwargs = _layer_inputs("d_fine", False)
    seen = []
    m.ms_deformable_attn_core = lambda *a: seen.append(a[2]) or mod.multi_scale_deformable_attention_v2(*a)
    m(hidden, **kwargs)
    loc = seen[0]
    assert (loc < 0).any() and (loc > 1).any() and ((loc > 0) & (loc < 1)).any()


def test_method_changed_after_conversion_runs_the_library_function():
    mod, m = _layer("rt_detr_v2", 2)
    hidden, kwargs = _layer_inputs("rt_detr_v2", False)
    holder = nn.ModuleList([m])
    opbridge.nn.convert(holder)
    m.method = holder[0].method = "discrete"
    for g, e in zip(holder[0](hidden, **kwargs), m(hidden, **kwargs)):
        assert g.equal(e)


# --- left alone ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
def test_discrete_method_left_alone_with_warning(family):
    mod, m = _layer(family, 2, method="discrete")
    model = nn.ModuleList([m])
    with pytest.warns(UserWarning, match=f"{FAMILIES[family]}MultiscaleDeformableAttention"):
        opbridge.nn.convert(model)
    assert model[0] is m


def test_replaced_core_left_alone_with_warning():
    mod, m = _layer("d_fine", [3, 5, 2])
    m.ms_deformable_attn_core = lambda *a: mod.multi_scale_deformable_attention_v2(*a)
    model = nn.ModuleList([m])
    with pytest.warns(UserWarning, match="DFineMultiscaleDeformableAttention"):
        opbridge.nn.convert(model)
    assert model[0] is m


def test_default_method_converted_without_warning():
    _, m = _layer("d_fine", [3, 5, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opbridge.nn.convert(nn.ModuleList([m]))


# --- whole models, random init, built from configs -----------------------------------------------

def _tiny(family):
    """The whole tiny model of `family` (benchmarks/benchmarks/_msda_models.py, which
    `opbridge optimize`'s tests and benchmarks use too), as a module returning (logits, boxes)."""
    _transformers()
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import _msda_models

    return (_msda_models.d_fine(points=(3, 5, 2)) if family == "d_fine" else _msda_models.rt_detr_v2()).model


@pytest.mark.parametrize("family", ["d_fine", "rt_detr_v2"])
def test_model_converted(family):
    model = _tiny(family).double()
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)  # levels 8x12, 4x6, 2x3
    with torch.no_grad():
        expected = model(x)
    layers = [n for n, m in model.named_modules() if type(m).__name__.endswith("MultiscaleDeformableAttention")]
    assert len(layers) == 2
    before = _state(model)
    opbridge.nn.convert(model)
    assert all(type(model.get_submodule(n)).__module__ == "opbridge.nn.ms_deform_attn_per_level" for n in layers)
    assert all(v.equal(before[k]) for k, v in model.state_dict().items()) and list(model.state_dict()) == list(before)
    with torch.no_grad():
        got = model(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


# --- export and ONNX Runtime ---------------------------------------------------------------------

class _Cross(nn.Module):
    """A converted D-FINE layer with fixed levels, tensors in and out (for export)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden, encoder, boxes):
        shapes = torch.tensor(LEVELS, dtype=torch.long)
        out, weights = self.layer(hidden, reference_points=boxes, encoder_hidden_states=encoder,
                                  spatial_shapes=shapes, spatial_shapes_list=LEVELS)
        return out, weights


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("lowering", ["custom", "standard"])
def test_layer_export_ort(dynamo, lowering):
    _, m = _layer("d_fine", [3, 5, 2])
    original = _Cross(m).float()
    model = opbridge.nn.convert(_Cross(m).float())
    assert type(model.layer).__module__ == "opbridge.nn.ms_deform_attn_per_level"
    _, _, s = _levels()

    def inputs(n):
        boxes = torch.cat([torch.rand(n, 6, 1, 2) * 1.2 - 0.1, torch.rand(n, 6, 1, 2) * 0.8 + 0.05], -1)
        return torch.randn(n, 6, 32), torch.randn(n, s, 32), boxes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter
        proto = opbridge.onnx.export(model, inputs(2), dynamo=dynamo, lowering=lowering)
    ops = [n.op_type for n in proto.graph.node]
    if lowering == "custom":
        assert ops.count("MultiScaleDeformableAttention") == 1 and "GridSample" not in ops
    else:
        assert ops.count("GridSample") == len(LEVELS) and "MultiScaleDeformableAttention" not in ops
        assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
    sess = opbridge.InferenceSession(proto)
    for n in (2, 3):  # the exported batch and another
        args = inputs(n)
        outs = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], [a.numpy() for a in args])))
        with torch.no_grad():
            expected = original(*args)
        for o, e in zip(outs, expected):
            np.testing.assert_allclose(o, e.numpy(), rtol=1e-4, atol=1e-5)


def _clear_topk_input(model):
    """An input whose encoder scores are >= 5e-4 apart among the top num_queries + 1: D-FINE picks
    its queries by torch.topk, and a near-tie could rank differently in ORT (float sums in
    another order) and pick or order other queries. Random init gives gaps down to ~1e-4."""
    scores = []
    hook = model.detr.model.enc_score_head.register_forward_hook(lambda m, i, o: scores.append(o.max(-1).values))
    try:
        for _ in range(10):
            x = torch.randn(2, 3, 64, 96)
            with torch.no_grad():
                expected = model(x)
            top = scores.pop().sort(1, descending=True).values[:, :model.detr.config.num_queries + 1]
            if float((top[:, :-1] - top[:, 1:]).min()) >= 5e-4:
                return x, expected
    finally:
        hook.remove()
    pytest.fail("no input with well-separated top-k encoder scores in 10 draws")


# ~10 s: the whole tiny D-FINE through the dynamo exporter (custom lowering) into ORT.
def test_d_fine_model_export_ort():
    model = _tiny("d_fine")
    x, expected = _clear_topk_input(model)
    opbridge.nn.convert(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = opbridge.onnx.export(model, (x,), dynamic_batch=False)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MultiScaleDeformableAttention") == 2 and "GridSample" not in ops
    sess = opbridge.InferenceSession(proto)
    outs = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    # ~15 float32 layers end to end (ORT and torch order their sums differently).
    for o, e in zip(outs, expected):
        e = e.numpy()
        assert o.shape == e.shape
        assert np.max(np.abs(o - e)) <= 1e-4 * max(1.0, float(np.max(np.abs(e))))
