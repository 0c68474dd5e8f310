"""Serving an opbridge model with Ray Serve: N replicas, each with its own ONNX Runtime session
that has opbridge's custom-op library registered.

    python examples/ray_serve/app.py MODEL.onnx [--replicas 2] [--port 8000]

Requests are HTTP POSTs whose body is an .npz archive with one array per model input (named as
the model's inputs); the reply is an .npz with one array per output (output_0, output_1, ...), and
the header ``x-opbridge-replica`` names the replica's process. .npz keeps dtypes and values exact
(no JSON round trip of floats).

Only onnxruntime, numpy and opbridge run in the replicas; torch is not needed to serve.
"""

from __future__ import annotations

import argparse
import io
import os

import numpy as np
from ray import serve


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
class OpbridgeModel:
    """One replica: loads the model into an opbridge.InferenceSession once, then runs requests."""

    def __init__(self, model_path: str, intra_op_threads: int = 1) -> None:
        import onnxruntime as ort

        import opbridge

        so = ort.SessionOptions()
        # Replicas share the machine's cores: one intra-op thread each unless told otherwise.
        so.intra_op_num_threads = intra_op_threads
        self.session = opbridge.InferenceSession(model_path, sess_options=so)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.replica = f"pid-{os.getpid()}"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing model inputs {missing}; the model takes {self.input_names}")
        return self.session.run(None, {n: feeds[n] for n in self.input_names})

    async def __call__(self, request):
        from starlette.responses import Response

        with np.load(io.BytesIO(await request.body())) as archive:
            feeds = {name: archive[name] for name in archive.files}
        try:
            outputs = self.run(feeds)
        except Exception as e:  # noqa: BLE001 - the client gets the reason, the replica lives on
            return Response(str(e).encode(), status_code=400, media_type="text/plain",
                            headers={"x-opbridge-replica": self.replica})
        buf = io.BytesIO()
        np.savez(buf, **{f"output_{i}": y for i, y in enumerate(outputs)})
        return Response(buf.getvalue(), media_type="application/octet-stream",
                        headers={"x-opbridge-replica": self.replica})


def app(model_path: str, replicas: int = 2, intra_op_threads: int = 1):
    """The Serve application: `replicas` copies of OpbridgeModel on `model_path`."""
    return OpbridgeModel.options(num_replicas=replicas).bind(os.path.abspath(model_path), intra_op_threads)


def encode(feeds: dict[str, np.ndarray]) -> bytes:
    """A request body for `feeds`."""
    buf = io.BytesIO()
    np.savez(buf, **feeds)
    return buf.getvalue()


def decode(body: bytes) -> list[np.ndarray]:
    """The outputs of a reply body, in the model's output order."""
    with np.load(io.BytesIO(body)) as archive:
        return [archive[f"output_{i}"] for i in range(len(archive.files))]


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    ns = parser.parse_args()
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": ns.host, "port": ns.port})
    serve.run(app(ns.model, ns.replicas), route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
