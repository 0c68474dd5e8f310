"""Exports the test models of benchmarks/benchmarks/_msda_models.py the way optimum does, for
test_optimize_optimum.py. Runs in a venv of its own with optimum-onnx (which needs
transformers < 4.58, where the test suite pins 5.x):

    python optimum_export.py OUT_DIR FAMILY [FAMILY ...]

Per family, OUT_DIR/FAMILY/ receives the random-init model saved with save_pretrained (hf/),
optimum's export of it (model.onnx: ``optimum.exporters.onnx.main_export``, task
object-detection, optimum's default opset and dynamic axes), and reference.npz: two inputs
(batch 1 at 320x416 and batch 2 at 256x352) with the torch model's float64 outputs, computed here,
where the model was built, so that no other transformers release has to load it. meta.json holds
the number of deformable-attention modules and the versions."""

from __future__ import annotations

import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks", "benchmarks"))


def main(out: str, families: list[str]) -> None:
    from importlib.metadata import version

    import numpy as np
    import torch
    import transformers
    from optimum.exporters.onnx import main_export

    import _msda_models as models

    for family in families:
        torch.manual_seed(0)
        built = models.FAMILIES[family]()
        detr = built.model.detr
        folder = os.path.join(out, family)
        detr.save_pretrained(os.path.join(folder, "hf"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main_export(os.path.join(folder, "hf"), output=folder, task="object-detection", do_validation=False)
        rng = np.random.default_rng(7)
        ref = {}
        double = detr.double().eval()
        for i, (n, h, w) in enumerate([(1, 320, 416), (2, 256, 352)]):
            x = rng.standard_normal((n, 3, h, w))
            with torch.no_grad():
                y = double(pixel_values=torch.from_numpy(x))
            ref[f"x{i}"] = x
            ref[f"logits{i}"] = y.logits.numpy()
            ref[f"pred_boxes{i}"] = y.pred_boxes.numpy()
        np.savez(os.path.join(folder, "reference.npz"), **ref)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"modules": built.modules, "transformers": transformers.__version__,
                       "optimum-onnx": version("optimum-onnx"), "torch": torch.__version__}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
