"""Builds a Triton Inference Server model repository that serves an opbridge model with Triton's
ONNX Runtime backend (docs/deploy.md):

    REPO/opbridge_demo/config.pbtxt          the model configuration (written from the ONNX model)
    REPO/opbridge_demo/1/model.onnx          the exported model (version 1)
    REPO/opbridge_demo/libopbridge_ort.so    opbridge's custom-op library, loaded by the backend
                                             through model_operations { op_library_filename }

    python examples/triton/make_repository.py REPO [--server-root /models]

--server-root is where REPO is mounted inside the Triton server (the `-v REPO:/models` of its
docker run): op_library_filename must be the library's path as the server sees it.
Needs torch (to export the demo model) and opbridge.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

MODEL_NAME = "opbridge_demo"
MAX_BATCH_SIZE = 8
# ONNX element type -> Triton data type (model_config.proto DataType).
_TRITON_TYPES = {1: "TYPE_FP32", 11: "TYPE_FP64", 10: "TYPE_FP16", 16: "TYPE_BF16", 7: "TYPE_INT64", 6: "TYPE_INT32"}


def demo_model():
    """A small conv net with opbridge GroupNorm layers, as `opbridge demo` uses."""
    import torch

    import opbridge.nn

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), opbridge.nn.GroupNorm(4, 16), torch.nn.SiLU(),
        torch.nn.Conv2d(16, 8, 3, padding=1), opbridge.nn.GroupNorm(2, 8),
    ).eval()


def config_text(model_path: Path, library_path: str) -> str:
    """config.pbtxt for the ONNX model at model_path: its inputs and outputs without the batch dim
    (Triton adds it: max_batch_size > 0), two CPU instances, and opbridge's library."""
    import onnx

    model = onnx.load(str(model_path))

    def tensors(values, kind):
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim][1:]  # without batch
            out.append(f"{kind} [\n  {{\n    name: \"{v.name}\"\n    data_type: {_TRITON_TYPES[t.elem_type]}\n"
                       f"    dims: [ {', '.join(str(d) for d in dims)} ]\n  }}\n]")
        return out

    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    return "\n".join([
        f"name: \"{MODEL_NAME}\"",
        "backend: \"onnxruntime\"",
        f"max_batch_size: {MAX_BATCH_SIZE}",
        *tensors(inputs, "input"),
        *tensors(model.graph.output, "output"),
        "instance_group [\n  {\n    kind: KIND_CPU\n    count: 2\n  }\n]",
        "# opbridge's custom ops (ai.opbridge domain): the ONNX Runtime backend registers this library",
        "# in every session of this model. The path is the library's path inside the server.",
        f"model_operations {{\n  op_library_filename: \"{library_path}\"\n}}",
        "",
    ])


def make(repo: Path, server_root: str = "/models") -> Path:
    """Writes the repository under `repo`; returns the model's folder."""
    import torch

    import opbridge
    import opbridge.onnx

    folder = Path(repo) / MODEL_NAME
    (folder / "1").mkdir(parents=True, exist_ok=True)
    opbridge.onnx.export(demo_model(), (torch.randn(2, 3, 32, 32),), folder / "1" / "model.onnx")
    library = Path(opbridge.get_library_path())
    shutil.copy2(library, folder / library.name)
    server_path = f"{server_root.rstrip('/')}/{MODEL_NAME}/{library.name}"
    (folder / "config.pbtxt").write_text(config_text(folder / "1" / "model.onnx", server_path))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--server-root", default="/models")
    ns = parser.parse_args()
    print(make(ns.repo, ns.server_root))


if __name__ == "__main__":
    main()
