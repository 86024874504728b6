"""The measured cost table: what it times, its key, and that what is stored is reused, not re-timed."""

from __future__ import annotations

import torch

from specbench.analysis import cost_table
from specbench.analysis.cost_table import Grid
from specbench.bench import cost_timing
from specbench.bench.cost_timing import drafter_key, measure_costs
from specbench.methods.build import Strategy
from specbench.methods.combine import CombinedDrafter
from specbench.methods.controllers import FixedController
from specbench.methods.draft_model import DraftModelDrafter, DraftOptions
from specbench.methods.ngram import NgramDrafter, NgramOptions
from specbench.methods.suffix import SuffixDrafter, SuffixOptions
from tests.helpers import small_vocab_lm, tiny_target

GRID = Grid(verify_lengths=(1, 2, 4), context_lens=(8, 16), budgets=(1, 2), repeats=2, warmup=1)


def ngram(max_ngram: int = 2) -> Strategy:
    return Strategy("ngram", NgramDrafter(NgramOptions(max_ngram=max_ngram)), lambda: FixedController(2))


def test_measures_every_shape_once_and_reuses_the_stored_table(tmp_path, monkeypatch):
    monkeypatch.setattr(cost_table, "trusted", lambda entry: True)  # tiny forwards jitter: trust is tested below
    target = tiny_target()
    table = measure_costs(target.model, [ngram()], lambda: [1, 2, 3, 1, 2], tmp_path, GRID)
    shapes = {(r["batch"], r["tokens"], r["context"], r["mask"]) for r in table.target}
    assert shapes == {(1, n, c, m) for n in (1, 2, 4) for c in (8, 16) for m in ("chain", "tree")} - {
        (1, 1, c, "tree") for c in (8, 16)}  # a 1-token tree is a chain
    assert all(r["median_s"] > 0 for r in table.target)
    assert [r["budget"] for r in table.drafters[drafter_key(ngram())]] == [1, 2]
    assert table.target_s(3, 12) > 0 and table.drafter_s(drafter_key(ngram()), 1.5) > 0

    timed = []
    monkeypatch.setattr(cost_timing, "time_targets", lambda *a: timed.append(a) or [])
    monkeypatch.setattr(cost_timing, "time_drafter", lambda *a: timed.append(a) or {"budget": a[3], "median_s": 1.0})
    again = measure_costs(target.model, [ngram()], lambda: timed.append("context") or [1, 2, 3], tmp_path, GRID)
    assert timed == [] and again.as_json() == table.as_json()  # nothing timed, no context made for it
    other = measure_costs(target.model, [ngram(max_ngram=3)], lambda: [1, 2, 3], tmp_path, GRID)
    assert len(timed) == 2 and len(other.drafters) == 2  # other knobs: another drafter entry, target reused


def test_entries_timed_on_a_busy_machine_are_timed_again(tmp_path, monkeypatch):
    assert cost_table.trusted({"spread": 0.05, "others_cpu": 0.02})
    assert not cost_table.trusted({"spread": 0.6, "others_cpu": 0.0})  # the repeats disagree
    assert not cost_table.trusted({"spread": 0.05, "others_cpu": 0.5})  # other processes held the CPUs
    assert not cost_table.trusted({"spread": 0.05})  # a table that never said how busy the machine was
    target = tiny_target()
    grid = Grid(verify_lengths=(1, 2), context_lens=(8,), masks=("chain",), budgets=(1,), repeats=2, warmup=0)
    monkeypatch.setattr(cost_timing.noise.Window, "SHORTEST_S", 0.0)
    monkeypatch.setattr(cost_timing.noise, "others_share", lambda first, last, cpus=None: 0.6)
    busy = measure_costs(target.model, [ngram()], lambda: [1, 2, 3], tmp_path, grid)
    assert all(r["others_cpu"] == 0.6 for r in busy.target)  # used by this run, recorded as busy
    assert cost_table.load_table(tmp_path, busy.key).target == []  # and not reused
    assert cost_table.trusted({"spread": 0.05, "others_cpu": None})  # timed too briefly to tell
    monkeypatch.setattr(cost_timing.noise, "others_share", lambda first, last, cpus=None: 0.0)
    monkeypatch.setattr(cost_table, "trusted", lambda entry: entry["others_cpu"] == 0.0)
    quiet = measure_costs(target.model, [ngram()], lambda: [1, 2, 3], tmp_path, grid)
    assert len(quiet.target) == 2 and all(r["others_cpu"] == 0.0 for r in quiet.target)  # timed again


def test_keys_name_the_model_device_dtype_torch_and_code():
    key = cost_timing.table_key(tiny_target().model)
    assert set(key) == {"model", "device", "dtype", "torch", "threads", "drafter_context", "code"}
    assert key["dtype"] == "float32"
    assert cost_timing.table_key(tiny_target(seed=1).model)["model"] != key["model"]


def test_a_changed_engine_source_is_another_table(tmp_path, monkeypatch):
    # the engine's kernels changed what a forward costs: entries timed before are not reused
    package = tmp_path / "engine"
    package.mkdir()
    (package / "flat.py").write_text("x = 1\n")
    monkeypatch.setattr(cost_timing.engine_package, "__file__", str(package / "__init__.py"))
    cost_timing.code_digest.cache_clear()
    before = cost_timing.table_key(tiny_target().model)["code"]
    (package / "flat.py").write_text("x = 2\n")
    cost_timing.code_digest.cache_clear()
    assert cost_timing.table_key(tiny_target().model)["code"] != before
    cost_timing.code_digest.cache_clear()


def test_entries_are_timed_in_rounds():
    # each shape once per round, so a slow spell of the machine reaches all of them, not a few
    calls = []
    rounds = [lambda: calls.append("a"), lambda: calls.append("b")]
    timings = cost_timing._time_rounds(rounds, 2, 1, torch.device("cpu"))
    assert calls == ["a", "b"] * 3 and [set(t) for t in timings] == [{"median_s", "spread"}] * 2


def test_a_run_whose_stored_table_lacks_trusted_entries_finishes_with_a_note(tiny_model_dir, tmp_path, monkeypatch):
    """Entries timed on a busy machine are left out when a table is read back: the load axis then says
    what is missing instead of failing the run (it raised KeyError: no chain target costs at batch 1)."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setattr(cost_table, "trusted", lambda entry: entry.get("mask") != cost_table.CHAIN)
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--strategy", "ngram", "--limit", "1",
                                      "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["load"]["note"]
    assert "no chain target costs at batch 1" in note and "specbench costs" in note


def test_proposals_a_run_times_on_a_busy_machine_price_its_own_load_axis(tiny_model_dir, tmp_path, monkeypatch):
    """A run's load axis prices with the table it timed: the proposal entries it timed itself count even
    when a later read would leave them out as untrusted (they did not: 'no proposal costs for ngram')."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setattr(cost_table, "trusted", lambda entry: "budget" not in entry)  # proposals read back: untrusted
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--strategy", "ngram", "--limit", "1",
                                      "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    load = json.loads(result.stdout)["load"]
    assert "note" not in load and {p["strategy"] for p in load["points"]} == {"ngram"}


def test_a_model_without_drafters_prices_every_model_free_method():
    # `specbench costs` on a user's model: no drafter given, so only the methods that need none
    names = [s.name for s in cost_timing.cost_strategies(tiny_target(), [])]
    assert names == [n for n in cost_timing.DRAFTER_NAMES if n in ("ngram", "suffix")] and "suffix" in names


def test_a_drafter_with_a_network_is_timed_catching_up_on_tokens_it_sat_out(tmp_path, monkeypatch):
    monkeypatch.setattr(cost_table, "trusted", lambda entry: True)
    target = tiny_target()
    draft = Strategy("draft", DraftModelDrafter(small_vocab_lm(1), DraftOptions(k=2)), lambda: FixedController(2))
    grid = Grid(verify_lengths=(1, 2), context_lens=(8,), masks=("chain",), budgets=(1, 2), backlogs=(4, 16),
                repeats=2, warmup=1)
    table = measure_costs(target.model, [draft, ngram()], lambda: [1, 2, 3, 1, 2], tmp_path, grid)
    timed = {(r["budget"], r["absorbed"]) for r in table.drafters[drafter_key(draft)]}
    assert timed == {(1, 1), (2, 1), (1, 4), (1, 16)}  # backlogs at the first budget
    assert {r["absorbed"] for r in table.drafters[drafter_key(ngram())]} == {1}  # model-free: nothing to catch up
    key = drafter_key(draft)
    assert table.catch_up_s(key, 1) == 0.0 and table.catch_up_s(key, 10) >= 0.0
    assert table.catch_up_s(drafter_key(ngram()), 10) == 0.0
    assert table.drafter_s(key, 2) == next(r["median_s"] for r in table.drafters[key] if r["budget"] == 2)


def test_timing_a_drafter_leaves_the_runs_drafter_as_it_was(tmp_path, monkeypatch):
    """Suffix decoding keeps the run's answers: a proposal timed before the run must not add its context."""
    monkeypatch.setattr(cost_table, "trusted", lambda entry: True)
    suffix = Strategy("suffix", SuffixDrafter(SuffixOptions()), lambda: FixedController(4))
    grid = Grid(verify_lengths=(1,), context_lens=(8,), masks=("chain",), budgets=(2,), repeats=2, warmup=0)
    measure_costs(tiny_target().model, [suffix], lambda: [1, 2, 3, 1, 2], tmp_path, grid)
    assert list(suffix.drafter.history.trie.matches([1, 2])) == []
    members = [SuffixDrafter(SuffixOptions()), DraftModelDrafter(small_vocab_lm(1), DraftOptions(k=2))]
    combination = CombinedDrafter(members, [lambda: FixedController(2)] * 2)
    copied = cost_timing.scratch_copy(combination)
    assert copied is not combination and copied.members[0].history is not combination.members[0].history
    assert copied.calibration is not combination.calibration
    assert copied.members[1].model is combination.members[1].model  # networks shared, never copied
