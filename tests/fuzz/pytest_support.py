"""The fuzz CI subset as pytest tests (tests/reliability/test_fuzz_ort.py, tests/reliability/test_fuzz_torch.py).

OPBRIDGE_FUZZ_CASES (default 200) cases per op; the seed derives from OPBRIDGE_FUZZ_SEED
(default fixed, so CI is deterministic) and is printed. A failure is shrunk by hypothesis to a
small case and reported with the harness's verdict and detail.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed

from . import harness
from .run import derive_seed

CASES = int(os.environ.get("OPBRIDGE_FUZZ_CASES", "200"))
# Fixed by default: CI runs the same cases every time; set the variable to explore others.
BASE_SEED = int(os.environ.get("OPBRIDGE_FUZZ_SEED", "20261121"))


def run_fuzz(module, kind: str, worker: harness.Worker, cases: int = CASES) -> None:
    seed = derive_seed(BASE_SEED, module.OP, kind)
    print(f"fuzz {module.OP}/{kind}: {cases} cases, seed {seed} (from OPBRIDGE_FUZZ_SEED={BASE_SEED})")

    @settings(max_examples=cases, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              print_blob=False)
    @hyp_seed(seed)
    @given(getattr(module, f"{kind}_cases")())
    def body(case):
        result = harness.judge(case, worker)
        assert result.verdict == "pass", f"{result.verdict}: {case.desc}\n{result.detail}"

    body()
