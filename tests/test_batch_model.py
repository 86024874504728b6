"""The load-axis model on a hand-made cost table: tau, the padded verify block, modelled speedups,
where speculation stops paying, the best draft tokens per batch size and the schedules written from
them; and the GPU projection's batch axis."""

from __future__ import annotations

import tomllib

import pytest

from specbench.analysis import batch_model
from specbench.analysis.batch_model import DraftShape, best_caps, expected_block, modelled, stops_paying, sweep, tau
from specbench.analysis.hardware import BUILTIN_PROFILES
from specbench.analysis.projection import WorkloadShape, by_batch, project
from specbench.bench.cost_timing import CostTable
from specbench.core.errors import SpecbenchError
from specbench.methods.controllers import CappedController, FixedController
from specbench.methods.draft_schedule import cap_at, schedule_entry, schedule_toml, vllm_config
from specbench.methods.registry import vllm_method
from specbench.plan.run_config import load_config_file, resolve

MS = 1e-3


def hand_table() -> CostTable:
    """Verify costs linear in the tokens of the batch above a floor (memory-bound, then compute-bound):
    max(10 ms, 1 ms x batch x tokens) at context 100, twice that at context 300; 1 ms per proposal;
    an overhead of 0.1 ms per sequence."""
    target = [{"batch": b, "tokens": n, "context": c, "mask": mask, "median_s": max(10, b * n) * MS * c / 100,
               "spread": 0.0}
              for b in (1, 4, 16) for n in (1, 2, 4, 8) for c in (100, 300) for mask in ("chain", "tree")
              if not (mask == "tree" and n == 1)]
    overhead = [{"batch": b, "tokens": n, "median_s": 0.1 * b * MS, "spread": 0.0} for b in (1, 4, 16) for n in (1, 8)]
    drafters = {"d:1": [{"budget": k, "depth": k, "median_s": 1 * MS, "spread": 0.0} for k in (1, 8)]}
    return CostTable({"model": "hand"}, target, drafters, overhead)


# acceptance 0.8 then 0.5 then 0; two drafts on every step
SHAPE = DraftShape.measured([0.8, 0.5], [0, 0, 10], context=100, drafter="d:1", budget=2)


def test_tau_and_block():
    assert tau(SHAPE) == pytest.approx(1 + 0.8 + 0.8 * 0.5)
    assert tau(SHAPE, cap=1) == pytest.approx(1.8) and tau(SHAPE, cap=0) == 1.0
    assert expected_block(SHAPE.drafted, 16) == pytest.approx(3.0)  # every step drafts 2: no padding
    half = DraftShape.measured([0.5], [1, 0, 1], 100, "d:1", 2).drafted  # 0 or 2 drafts, evenly
    assert expected_block(half, 1) == pytest.approx(2.0)  # 1 + E[d]
    assert expected_block(half, 4) == pytest.approx(1 + 2 * (1 - 0.5 ** 4))  # padded to the largest of 4
    assert SHAPE.capped(1) == (0.0, 1.0)


def test_modelled_speedup_by_hand():
    table = hand_table()
    # batch 1: ar = 10 + 0.1 ms; a step = verify 3 tokens (10 ms) + 1 proposal (1 ms) + 0.1 ms
    one = modelled(table, SHAPE, 1)
    assert one["step_s"] == pytest.approx(11.1 * MS) and one["ar_step_s"] == pytest.approx(10.1 * MS)
    assert one["speedup"] == pytest.approx(2.2 * 10.1 / 11.1)
    # batch 16: ar = 16 + 1.6 ms; a step = 48 + 16 x 1 + 1.6 ms: compute-bound, speculation loses
    sixteen = modelled(table, SHAPE, 16)
    assert sixteen["speedup"] == pytest.approx(2.2 * 17.6 / 65.6)
    assert sixteen["tokens_per_s"] == pytest.approx(16 * 2.2 / (65.6 * MS))
    points = sweep(table, SHAPE)
    assert [p["batch_size"] for p in points] == [1, 4, 16]
    assert stops_paying(points) == 16
    # context 200 interpolates halfway between the two measured contexts
    wide = modelled(table, DraftShape.measured([0.8, 0.5], [0, 0, 10], 200, "d:1", 2), 1)
    assert wide["verify_s"] == pytest.approx(20 * MS)


def test_a_draining_batch_is_priced_at_the_rows_still_active():
    # four sequences of 4, 2, 2 and 1 steps in one batch of 4: 1 step at 4 rows, 1 at 3, 2 at 1
    assert batch_model.drain([4, 2, 2, 1], 4) == {4: 1, 3: 1, 1: 2}
    assert batch_model.drain([4, 2, 2, 1], 2) == {2: 3, 1: 3}  # two batches: [4, 2] and [2, 1]
    assert batch_model.drain([3, 3], 4) == {2: 3}  # a short one
    # plain decoding runs their 8, 4, 4 and 2 tokens: 2 steps at 4 rows, 2 at 3, 4 at 1
    shape = DraftShape.measured([0.8, 0.5], [0, 0, 10], 100, "d:1", 2, sequences=[(4, 8), (2, 4), (2, 4), (1, 2)])
    table = hand_table()
    # a step at r rows: verify 3 tokens (10 ms at batch 1; 13 at batch 4, halfway from 2 tokens' 10 to 4
    # tokens' 16; 12 at r = 3, two thirds of the way from batch 1 to 4), r proposals of 1 ms and 0.1 r ms
    # of overhead; plain decoding 10 + 0.1 r ms
    spec = 2 * (10 + 1 + 0.1) + (12 + 3 + 0.3) + (13 + 4 + 0.4)
    ar = 4 * 10.1 + 2 * 10.3 + 2 * 10.4
    point = modelled(table, shape, 4)
    assert point["speedup"] == pytest.approx(ar / spec)
    assert point["tokens_per_s"] == pytest.approx(18 / (spec * MS))
    assert point["rows"] == pytest.approx(9 / 4) and point["ar_step_s"] == pytest.approx(ar / 8 * MS)
    # a batch that never empties (continuous batching): tau tokens per row per step at 4 rows
    assert modelled(table, DraftShape.measured([0.8, 0.5], [0, 0, 10], 100, "d:1", 2), 4)["speedup"] == \
        pytest.approx(2.2 * 10.4 / 17.4)
    # a table of batch 4 alone prices fewer rows at its costs
    four = CostTable(table.key, [r for r in table.target if r["batch"] == 4], table.drafters,
                     [r for r in table.overhead if r["batch"] == 4])
    spec = 2 * (13 + 1 + 0.4) + (13 + 3 + 0.4) + (13 + 4 + 0.4)
    assert modelled(four, shape, 4)["speedup"] == pytest.approx(8 * 10.4 / spec)
    # no drafts: the same steps as plain decoding, the same cost
    assert modelled(table, shape, 4, cap=0)["speedup"] == pytest.approx(1.0)


def test_best_draft_tokens_per_batch_size():
    best = best_caps(hand_table(), SHAPE)
    assert [p["draft_tokens"] for p in best] == [2, 2, 0]  # batch 4: 12 + 4 + 0.4 ms for 2.2 tokens still pays
    assert best[-1]["speedup"] == 1.0
    tree = DraftShape.measured([0.8, 0.5], [0, 0, 10], 100, "d:1", 2, tree=True)
    assert [p["draft_tokens"] for p in best_caps(hand_table(), tree)] == [2, 2, 0]  # all or nothing


def test_proposals_are_priced_at_the_budget_not_at_the_drafts_kept():
    # a drafter that computes a block of 8 and keeps 2 by confidence costs its 8-token proposal
    table = hand_table()
    table.drafters["b:1"] = [{"budget": k, "depth": 2, "median_s": k * MS, "spread": 0.0} for k in (1, 8)]
    cut = DraftShape.measured([0.8, 0.5], [0, 0, 10], 100, "b:1", budget=8)
    assert modelled(table, cut, 4)["draft_s"] == pytest.approx(4 * 8 * MS)
    assert modelled(table, cut, 4, cap=2)["draft_s"] == pytest.approx(4 * 2 * MS)  # the cap is the budget
    assert modelled(table, cut, 4, cap=0)["draft_s"] == 0.0


def test_missing_drafter_costs_are_one_line():
    with pytest.raises(SpecbenchError, match="no proposal costs for other"):
        modelled(hand_table(), DraftShape.measured([0.5], [0, 1], 100, "other:2", 1), 4)


def test_schedule_round_trips_through_a_run_config(tmp_path):
    entry = schedule_entry(best_caps(hand_table(), SHAPE))
    assert entry == {"batch_sizes": [1, 4, 16], "draft_tokens": [2, 2, 0]}
    text = schedule_toml({"dflash": entry, "eagle+dflash": entry}, "a hand-made table")
    path = tmp_path / "schedule.toml"
    path.write_text(text)
    config = resolve(load_config_file(path), {}).config
    assert config.draft_schedule["dflash"] == entry and tomllib.loads(text)["draft_schedule"]["eagle+dflash"] == entry
    assert [cap_at(entry, b) for b in (1, 3, 4, 15, 16, 64)] == [2, 2, 2, 2, 0, 0]
    capped = CappedController(FixedController(5), cap_at(entry, 16))
    assert capped.budget() == 0


def test_vllm_form():
    form = vllm_config(vllm_method("dflash"), {"batch_sizes": [1, 4, 16, 32], "draft_tokens": [7, 5, 5, 0]})
    assert form == {"method": "dflash", "num_speculative_tokens": 7,
                    "num_speculative_tokens_per_batch_size": [[1, 3, 7], [4, 31, 5], [32, 32, 0]]}
    assert vllm_method("eagle+dflash") is None  # a combination: no vLLM counterpart
    assert vllm_config(None, {"batch_sizes": [1], "draft_tokens": [3]}) is None
    assert vllm_config(vllm_method("ngram"), {"batch_sizes": [1], "draft_tokens": [0]}) is None  # never drafts


@pytest.mark.parametrize("entry, message", [
    ({"batch_sizes": [4, 1], "draft_tokens": [1, 2]}, "increasing order"),
    ({"batch_sizes": [1, 4], "draft_tokens": [1]}, "one integer >= 0 per batch size"),
    ({"batch_sizes": [1], "draft_tokens": [-1]}, "one integer >= 0"),
    ({"batch_sizes": [1]}, "exactly batch_sizes"),
])
def test_bad_schedules_are_one_line(entry, message):
    with pytest.raises(SpecbenchError, match=message):
        resolve({"draft_schedule": {"dflash": entry}}, {})


def test_projection_gains_the_batch_axis():
    """At batch 1 the verify forward is memory-bound and speculation pays; the FLOPs of B x tokens
    verified grow until it is compute-bound, and there the speedup falls below 1 (at a short context:
    at a long one every sequence's KV reads keep plain decoding memory-bound, and speculation pays longer)."""
    shape = WorkloadShape(target_params=8e9, bytes_per_param=2, drafter_params=0.2e9, kv_bytes_per_token=131072,
                          context_len=128, tokens_verified=8, draft_forwards=1, tau=3.5, draft_tokens_per_forward=8)
    h100 = BUILTIN_PROFILES["h100-sxm"]
    sweep_ = by_batch(shape, h100)
    speedups = [p["speedup"] for p in sweep_["points"]]
    assert speedups[0] > 2 and speedups[-1] < 1
    assert all(a >= b - 0.01 for a, b in zip(speedups, speedups[1:]))
    stop = sweep_["stops_paying_at"]
    assert stop is not None and speedups[[p["batch_size"] for p in sweep_["points"]].index(stop)] < 1
    assert sweep_["points"][-1]["verify_bound"] == "compute"
    # throughput of the batch: B sequences' tokens per step; KV read per sequence
    one, eight = project(shape, h100), project(WorkloadShape(**{**shape.__dict__, "batch_size": 8}), h100)
    assert eight["memory_fit"]["need_gb"] > one["memory_fit"]["need_gb"]
    assert eight["ar_tokens_per_s"] > 7 * one["ar_tokens_per_s"]
    long = by_batch(WorkloadShape(**{**shape.__dict__, "context_len": 8192}), h100)
    assert long["stops_paying_at"] is None or long["stops_paying_at"] > stop
