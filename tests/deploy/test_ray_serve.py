"""examples/ray_serve: two Ray Serve replicas, each with its own opbridge session, answer a bounded
number of HTTP requests over loopback (127.0.0.1 only); every answer matches torch.

Slow (Ray starts a local cluster: ~30-60 s here), so it runs with --run-slow; skipped where ray
is not installed (pip install "opbridge[serve]")."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import socket
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'opbridge[serve]')")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install 'opbridge[serve]')")
torch = pytest.importorskip("torch")
import opbridge.nn  # noqa: E402
import opbridge.onnx  # noqa: E402
import opbridge.ops  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "examples" / "ray_serve" / "app.py"
REQUESTS = 32  # bounded: the test sends exactly this many
CONCURRENCY = 4
TIMEOUT_S = 120


def _load_app():
    spec = importlib.util.spec_from_file_location("opbridge_ray_serve_app", APP)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    # The replicas cannot import this file by name: ship the deployment class by value.
    ray.cloudpickle.register_pickle_by_value(mod)
    return mod


class Net(torch.nn.Module):
    """Two outputs: conv -> opbridge GroupNorm -> ReLU on images, and per-item inverses
    (on_singular="nan") of a batch of 3 x 3 matrices."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = opbridge.nn.GroupNorm(4, 8)

    def forward(self, x, m):
        return torch.relu(self.norm(self.conv(x))), opbridge.ops.inverse(m, on_singular="nan")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    path = tmp_path_factory.mktemp("ray_serve") / "net.onnx"
    opbridge.onnx.export(model, (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 3)), path)
    app = _load_app()
    env = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report to the outside
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = _free_port()
    # Everything on loopback: the node's address, Serve's HTTP proxy; no dashboard.
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             namespace="opbridge-test")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app.app(str(path), replicas=2), name="opbridge", route_prefix="/")
        yield model, app, f"http://127.0.0.1:{port}/"
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _post(url, body):
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        return r.status, r.headers["x-opbridge-replica"], r.read()


def test_two_replicas_answer_like_torch(served):
    model, app, url = served
    rng = np.random.default_rng(1234)
    cases = []
    for i in range(REQUESTS):
        batch = 1 + i % 4
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        m = rng.standard_normal((batch, 3, 3)).astype(np.float32) + 3 * np.eye(3, dtype=np.float32)
        if i % 5 == 0:
            m[0, 1] = 0.0  # a singular matrix: NaN for that item only
        cases.append({"x": x, "m": m})

    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        replies = list(pool.map(lambda feeds: _post(url, app.encode(feeds)), cases))

    replicas = set()
    for feeds, (status, replica, body) in zip(cases, replies):
        assert status == 200
        replicas.add(replica)
        y, inv = app.decode(body)
        with torch.no_grad():
            want_y, want_inv = (t.numpy() for t in model(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["m"])))
        np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(inv, want_inv, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert np.isnan(inv[0]).all() == (feeds["m"][0, 1] == 0).all()
    # Both replicas, each with its own session, served requests.
    assert len(replicas) == 2, replicas


def test_bad_request_is_a_400_naming_the_inputs(served):
    _, app, url = served
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(url, app.encode({"x": np.zeros((1, 3, 8, 8), np.float32)}))
    assert info.value.code == 400
    assert "missing model inputs ['m']" in info.value.read().decode()
