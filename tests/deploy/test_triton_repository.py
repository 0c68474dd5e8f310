"""examples/triton: the model repository for Triton's ONNX Runtime backend. No Triton server can be
installed here (no PyPI package has its ONNX Runtime backend), so this checks what can be checked
without one: config.pbtxt parses as a ModelConfig (the fields it uses, from Triton's
model_config.proto), names the model's real inputs and outputs, and its
model_operations.op_library_filename is opbridge's library -- which, registered the way the backend
registers it (RegisterCustomOpsLibrary on the session options), runs the model like torch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
import opbridge  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "triton"


def _make_repository():
    spec = importlib.util.spec_from_file_location("opbridge_triton_example", EXAMPLE / "make_repository.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _model_config_class():
    """The part of Triton's ModelConfig (model_config.proto) that the example uses, field names and
    numbers as there, for protobuf's text-format parser."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="opbridge_triton_subset.proto", package="inference", syntax="proto3")
    dt = f.enum_type.add(name="DataType")
    for i, n in enumerate(["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
                           "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
                           "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]):
        dt.value.add(name=n, number=i)

    def msg(name, fields):
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    tensor = [("name", 1, F.TYPE_STRING, opt, None), ("data_type", 2, F.TYPE_ENUM, opt, ".inference.DataType"),
              ("dims", 4, F.TYPE_INT64, rep, None)]
    msg("ModelInput", tensor)
    msg("ModelOutput", [("name", 1, F.TYPE_STRING, opt, None), ("data_type", 2, F.TYPE_ENUM, opt, ".inference.DataType"),
                        ("dims", 3, F.TYPE_INT64, rep, None)])
    group = msg("ModelInstanceGroup", [("name", 1, F.TYPE_STRING, opt, None), ("count", 2, F.TYPE_INT32, opt, None),
                                       ("kind", 4, F.TYPE_ENUM, opt, ".inference.ModelInstanceGroup.Kind")])
    kind = group.enum_type.add(name="Kind")
    for i, n in enumerate(["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]):
        kind.value.add(name=n, number=i)
    msg("ModelOperations", [("op_library_filename", 1, F.TYPE_STRING, rep, None)])
    msg("ModelConfig", [
        ("name", 1, F.TYPE_STRING, opt, None), ("platform", 2, F.TYPE_STRING, opt, None),
        ("max_batch_size", 4, F.TYPE_INT32, opt, None),
        ("input", 5, F.TYPE_MESSAGE, rep, ".inference.ModelInput"),
        ("output", 6, F.TYPE_MESSAGE, rep, ".inference.ModelOutput"),
        ("instance_group", 7, F.TYPE_MESSAGE, rep, ".inference.ModelInstanceGroup"),
        ("backend", 17, F.TYPE_STRING, opt, None),
        ("model_operations", 18, F.TYPE_MESSAGE, opt, ".inference.ModelOperations"),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def _parse(text):
    from google.protobuf import text_format

    return text_format.Parse(text, _model_config_class()())


def test_committed_example_config_is_what_the_script_writes(tmp_path):
    folder = _make_repository().make(tmp_path, "/models")
    committed = (EXAMPLE / "model_repository" / "opbridge_demo" / "config.pbtxt").read_text()
    assert (folder / "config.pbtxt").read_text() == committed
    cfg = _parse(committed)
    assert cfg.backend == "onnxruntime" and cfg.max_batch_size > 0
    assert list(cfg.model_operations.op_library_filename) == [
        f"/models/opbridge_demo/{Path(opbridge.get_library_path()).name}"]


def test_repository_runs_as_the_onnxruntime_backend_would(tmp_path, rng):
    mod = _make_repository()
    # server_root = the local folder: op_library_filename is then a real path here.
    folder = mod.make(tmp_path, str(tmp_path))
    cfg = _parse((folder / "config.pbtxt").read_text())
    (library,) = cfg.model_operations.op_library_filename
    assert Path(library).is_file() and Path(library).parent == folder
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)  # what model_operations makes the backend do
    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), sess_options=so, providers=["CPUExecutionProvider"])
    # The config's tensors are the model's, batch dim left out (max_batch_size > 0).
    assert [(i.name, i.dims) for i in cfg.input] == [(i.name, i.shape[1:]) for i in sess.get_inputs()]
    assert [(o.name, o.dims) for o in cfg.output] == [(o.name, o.shape[1:]) for o in sess.get_outputs()]
    assert [i.data_type for i in cfg.input] == [11]  # TYPE_FP32
    x = rng.standard_normal((cfg.max_batch_size,) + tuple(cfg.input[0].dims)).astype(np.float32)
    with torch.no_grad():
        want = mod.demo_model()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(sess.run(None, {cfg.input[0].name: x})[0], want, rtol=1e-4, atol=1e-4)
