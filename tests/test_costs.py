"""The measured cost table: what it times, its key, and that what is stored is reused, not re-timed."""

from __future__ import annotations

from specbench.measure import costs
from specbench.measure.costs import Grid, drafter_key, measure_costs
from specbench.strategies.build import Strategy
from specbench.strategies.controllers import FixedController
from specbench.strategies.ngram import NgramDrafter, NgramOptions
from tests.conftest import tiny_target

GRID = Grid(verify_lengths=(1, 2, 4), context_lens=(8, 16), budgets=(1, 2), repeats=2, warmup=1)


def ngram(max_ngram: int = 2) -> Strategy:
    return Strategy("ngram", NgramDrafter(NgramOptions(max_ngram=max_ngram)), lambda: FixedController(2))


def test_measures_every_shape_once_and_reuses_the_stored_table(tmp_path, monkeypatch):
    target = tiny_target()
    table = measure_costs(target.model, [ngram()], [1, 2, 3, 1, 2], tmp_path, GRID)
    shapes = {(r["batch"], r["tokens"], r["context"], r["mask"]) for r in table.target}
    assert shapes == {(1, n, c, m) for n in (1, 2, 4) for c in (8, 16) for m in ("chain", "tree")} - {
        (1, 1, c, "tree") for c in (8, 16)}  # a 1-token tree is a chain
    assert all(r["median_s"] > 0 for r in table.target)
    assert [r["budget"] for r in table.drafters[drafter_key(ngram())]] == [1, 2]
    assert table.target_s(3, 12) > 0 and table.drafter_s(drafter_key(ngram()), 1.5) > 0

    timed = []
    monkeypatch.setattr(costs, "time_target", lambda *a: timed.append(a))
    monkeypatch.setattr(costs, "time_drafter", lambda *a: timed.append(a) or {"budget": a[3], "median_s": 1.0})
    again = measure_costs(target.model, [ngram()], [1, 2, 3], tmp_path, GRID)
    assert timed == [] and again.as_json() == table.as_json()
    other = measure_costs(target.model, [ngram(max_ngram=3)], [1, 2, 3], tmp_path, GRID)
    assert len(timed) == 2 and len(other.drafters) == 2  # other knobs: another drafter entry, target reused


def test_keys_name_the_model_device_dtype_and_torch():
    key = costs.table_key(tiny_target().model)
    assert set(key) == {"model", "device", "dtype", "torch", "threads"} and key["dtype"] == "float32"
    assert costs.table_key(tiny_target(seed=1).model)["model"] != key["model"]
