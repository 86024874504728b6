"""Roofline projection and the Leviathan cost model, checked against hand-computed numbers."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from specbench.analysis.cost_model import StepShape, expected_tau, predict
from specbench.analysis.cost_table import CostTable
from specbench.analysis.hardware import BUILTIN_PROFILES, GpuProfile
from specbench.analysis.projection import (
    STEP_OVERHEAD_S,
    WorkloadShape,
    ar_shape,
    kv_bytes_per_token,
    memory_fit,
    project,
    step_time,
    workload_shape,
)
from specbench.core.errors import SpecbenchError
from tests.helpers import tiny_lm

# 1e9-parameter bf16 target (2e9 bytes), 1e8-parameter drafter (2e8 bytes), 1e5 KV bytes per token
# at 1000 tokens of context (1e8 bytes); 8 positions verified, 4 chain draft forwards, tau 3.
SHAPE = WorkloadShape(
    target_params=1e9, bytes_per_param=2, drafter_params=1e8, kv_bytes_per_token=1e5,
    context_len=1000, tokens_verified=8, draft_forwards=4, tau=3,
)


def test_rtx4090_memory_bound_by_hand():
    p = project(SHAPE, BUILTIN_PROFILES["rtx4090"])  # 1008 GB/s, 165.2 TFLOPS
    # verify: max(2.1e9 B / 1008e9 B/s = 2083.33 us, 1.6e10 FLOP / 165.2e12 = 96.9 us)
    assert p["verify_s"] == pytest.approx(2.1e9 / 1008e9)
    assert p["verify_bound"] == "memory"
    # draft: 4 x max(2e8 / 1008e9 = 198.41 us, 2e8 / 165.2e12 = 1.2 us)
    assert p["draft_s"] == pytest.approx(4 * 2e8 / 1008e9)
    step = 2.1e9 / 1008e9 + 4 * 2e8 / 1008e9 + 20e-6  # 2896.98 us
    assert p["step_s"] == pytest.approx(step)
    assert p["tokens_per_s"] == pytest.approx(3 / step)  # ~1035.6
    ar_step = 2.1e9 / 1008e9 + 20e-6  # 2103.33 us
    assert p["ar_tokens_per_s"] == pytest.approx(1 / ar_step)  # ~475.4
    assert p["speedup"] == pytest.approx(3 * ar_step / step)  # ~2.178
    assert p["speedup"] == pytest.approx(2.178, abs=1e-3)
    assert p["projected"] is True and p["memory_fit"]["projected"] is True
    assert p["gpu"] == "rtx4090"


def test_cpu_profile_compute_bound_by_hand():
    p = project(SHAPE, BUILTIN_PROFILES["cpu"])  # 20 GB/s, 0.1 TFLOPS
    # verify: max(2.1e9 / 20e9 = 0.105 s, 1.6e10 / 1e11 = 0.16 s) -> compute bound
    assert p["verify_bound"] == "compute"
    assert p["verify_s"] == pytest.approx(0.16)
    # draft: 4 x max(2e8 / 20e9 = 0.01 s, 2e8 / 1e11 = 0.002 s) = 0.04 s
    assert p["draft_s"] == pytest.approx(0.04)
    step = 0.16 + 0.04 + STEP_OVERHEAD_S
    ar_step = 0.105 + STEP_OVERHEAD_S  # ar verifies one token: memory bound again
    assert p["speedup"] == pytest.approx(3 * ar_step / step)  # ~1.575


def test_memory_bound_scales_with_bandwidth():
    slow = GpuProfile("slow", 80, 1000, 1e6, 4, "test")
    fast = GpuProfile("fast", 80, 2000, 1e6, 4, "test")
    a, b = step_time(SHAPE, slow), step_time(SHAPE, fast)
    assert a["verify_bound"] == b["verify_bound"] == "memory"
    assert a["step_s"] - STEP_OVERHEAD_S == pytest.approx(2 * (b["step_s"] - STEP_OVERHEAD_S))
    assert project(SHAPE, fast)["tokens_per_s"] > project(SHAPE, slow)["tokens_per_s"]


def test_ar_projection_is_speedup_one():
    p = project(ar_shape(SHAPE), BUILTIN_PROFILES["h200"])
    assert p["speedup"] == pytest.approx(1.0) and p["draft_s"] == 0.0


def test_memory_fit():
    fits, need, have = memory_fit(SHAPE, BUILTIN_PROFILES["rtx4090"])
    assert fits and need == pytest.approx(2.3) and have == 24  # 2e9 + 2e8 + 1e8 bytes
    # a 70B bf16 target with a 1B drafter and 32k context at 320 KiB/token does not fit in 24 GB
    big = WorkloadShape(70e9, 2, 1e9, kv_bytes_per_token(80, 8, 128, 2), 32768, 5, 4, 3)
    fits, need, have = memory_fit(big, BUILTIN_PROFILES["rtx4090"])
    assert not fits and need == pytest.approx((71e9 * 2 + 327680 * 32768) / 1e9) and have == 24
    assert project(big, BUILTIN_PROFILES["rtx4090"])["memory_fit"]["fits"] is False
    assert memory_fit(big, BUILTIN_PROFILES["b200"])[0]


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(36, 8, 128, 2) == 36 * 2 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"target_params": 0}, "target_params"),
        ({"tau": 9}, "exceeds tokens_verified"),
        ({"tau": 0.5}, "tau"),
        ({"draft_forwards": -1}, "draft_forwards"),
        ({"context_len": float("nan")}, "context_len"),
    ],
)
def test_bad_shapes(change, needle):
    fields = {**SHAPE.__dict__, **change}
    with pytest.raises(SpecbenchError, match=needle):
        WorkloadShape(**fields)


# -- cost model ----------------------------------------------------------------------------


def test_expected_tau_by_hand_and_leviathan_closed_form():
    assert expected_tau([0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.25)
    assert expected_tau([0.8, 0.5, 0.25], depth=1) == pytest.approx(1.8)
    a, gamma = 0.7, 5
    assert expected_tau([a] * gamma) == pytest.approx((1 - a ** (gamma + 1)) / (1 - a))
    assert expected_tau([]) == 1.0
    with pytest.raises(SpecbenchError, match="position 2"):
        expected_tau([0.5, 1.2])


def hand_table() -> CostTable:
    """Target forwards: 10 ms + 1 ms per extra token at context 64, twice that at 256 (chain and tree
    alike); the drafter: 2 ms per budget position."""
    target = [{"batch": 1, "tokens": n, "context": c, "mask": m, "spread": 0.0,
               "median_s": (c / 64) ** 0.5 * (0.010 + 0.001 * (n - 1))}
              for n in (1, 2, 4, 8) for c in (64, 256) for m in ("chain", "tree")]
    return CostTable({"model": "m"}, target, {"d": [{"budget": b, "median_s": 0.002 * b, "spread": 0.0}
                                                    for b in (1, 2, 4, 8)]})


def test_cost_table_interpolates_and_extends():
    table = hand_table()
    assert table.target_s(4, 64) == pytest.approx(0.013)
    assert table.target_s(3, 64) == pytest.approx(0.012)  # between measured lengths
    assert table.target_s(16, 64) == pytest.approx(0.010 + 0.015)  # past the last: the last slope continues
    assert table.target_s(1, 160) == pytest.approx(0.015)  # halfway between contexts 64 and 256
    assert table.drafter_s("d", 3) == pytest.approx(0.006)


def test_predict_from_the_table_by_hand():
    # tau 3 at 4 verified tokens, budget 3, context 64: (3 * 10 ms) / (6 ms + 13 ms)
    out = predict(StepShape(tau=3.0, verified=4, budget=3, context=64, tree=False), hand_table(), "d")
    assert out.predicted_speedup == pytest.approx(3 * 0.010 / (0.006 + 0.013))
    assert out.ar_step_s == pytest.approx(0.010)
    ar = predict(StepShape(tau=1.0, verified=1, budget=0, context=64, tree=False), hand_table(), None)
    assert ar.predicted_speedup == pytest.approx(1.0)


def test_a_block_drafter_that_drafts_under_a_token_a_step_projects():
    """dspark's confidence cut can draft nothing on most steps: its shape stays one the roofline takes."""
    rows = pd.DataFrame([{"steps": 4, "draft_depth": 2, "verified": 6, "new_tokens": 5, "prompt_tokens": 10}])
    block_drafter = SimpleNamespace(parallel_draft=True, members=[])
    shape = workload_shape(tiny_lm(), block_drafter, rows)
    assert (shape.draft_forwards, shape.draft_tokens_per_forward, shape.tau) == (0.5, 1.0, 1.25)
    assert project(shape, BUILTIN_PROFILES["rtx4090"])["speedup"] > 0
