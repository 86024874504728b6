"""`specbench costs` and `specbench run --batch-sizes` end to end on a local tiny model: the cost
table's key and reuse, batched runs with their lossless check, the load axis, resume, the draft
schedule, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specbench.analysis import cost_table
from specbench.analysis.cost_table import Grid, table_path
from specbench.bench.cost_timing import measure_costs, table_key
from specbench.cli import app
from specbench.decoding.target import load_target
from specbench.methods.build import build_strategy
from specbench.methods.names import parse_strategy
from specbench.plan.run_config import load_config_file

runner = CliRunner()
GRID = ["--batch-sizes", "1,2", "--verify-lengths", "1,2,4", "--context-lens", "16,64", "--repeats", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def measured(tiny_model_dir, tiny_draft_dir, tmp_path_factory):
    """A cost table, then a run at batch sizes 1 and 2 that models from it. Every stored entry counts as
    timed on a quiet machine: on a loaded one (CI beside other work) the reuse tests would otherwise see
    entries re-timed as untrusted; that judgement is tested on its own in test_costs.py."""
    out = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cost_table, "trusted", lambda entry: True)
        costs = invoke("costs", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, *GRID, "--out", out, "--json")
        assert costs.exit_code == 0, costs.output
        run = invoke("run", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, "-s", "ngram,draft",
                     "--batch-sizes", "1,2", "--limit", 3, "--max-new-tokens", 10, "--out", out, "--json",
                     "--warmup", 0)
        assert run.exit_code == 0, run.output
        yield json.loads(costs.stdout), json.loads(run.stdout), out


def test_cost_table_json_and_key(measured):
    table, _, out = measured
    assert set(table["key"]) == {"model", "device", "dtype", "torch", "threads", "drafter_context", "code"}
    assert table["key"]["dtype"] == "float32" and table["key"]["torch"] == torch.__version__
    shapes = {(r["batch"], r["tokens"], r["context"], r["mask"]) for r in table["target"]}
    assert (2, 4, 64, "chain") in shapes and (2, 4, 64, "tree") in shapes and (1, 1, 16, "tree") not in shapes
    assert {(r["batch"], r["tokens"]) for r in table["overhead"]} == {(b, n) for b in (1, 2) for n in (1, 2, 4)}
    assert {key.split(":")[0] for key in table["drafters"]} == {"ngram", "suffix", "draft"}  # model-free always
    assert all(r["median_s"] > 0 for r in table["target"]) and Path(table["path"]).parent == out / "costs"


def test_every_proposal_cost_is_timed_on_one_context(measured):
    # `costs`, the run's cost model and its load axis each time proposals: one context for all, so
    # the budgets of one drafter compare (feature drafters cost more on a longer context)
    _, _, out = measured
    stored = json.loads(next((out / "costs").glob("*.json")).read_text())
    budgets = {key.split(":")[0]: {r["budget"] for r in entries} for key, entries in stored["drafters"].items()}
    assert budgets["suffix"] == {1, 3, 7, 15}  # `costs`' budgets; the run (ngram, draft) adds its own
    assert {1, 3, 7, 15} < budgets["ngram"] and {1, 3, 7, 15} < budgets["draft"]
    assert len({r["context"] for entries in stored["drafters"].values() for r in entries}) == 1


def test_a_stored_cost_table_prints_as_tables(measured, tiny_model_dir, tiny_draft_dir, monkeypatch):
    """Without --json, `costs` prints what it stored for a person: the target's forwards, each drafter's proposals
    (fresh, not after a backlog) by budget, the batched step overhead."""
    _, _, out = measured
    monkeypatch.setattr(cost_table, "trusted", lambda entry: True)
    result = invoke("costs", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, *GRID, "--out", out)
    assert result.exit_code == 0, result.output
    proposals = result.stdout.split("one proposal per sequence, ms (k = draft budget)")[1]
    assert "target forward, ms" in result.stdout and "batched step overhead" in proposals
    assert all(name in proposals for name in ("ngram", "suffix", "draft")) and "k=15" in proposals


def test_cost_table_is_reused_not_remeasured(measured, tiny_model_dir):
    table, _, out = measured
    target = load_target(tiny_model_dir, torch.device("cpu"), torch.float32)
    strategies = [build_strategy(parse_strategy("ngram"), target, {}, {})]
    timed = []
    grid = Grid(batch_sizes=(1, 2), verify_lengths=(1, 2, 4), context_lens=(16, 64), budgets=(1, 3, 7, 15), repeats=1)
    again = measure_costs(target.model, strategies, lambda: list(range(20)), out, grid, lambda *a: timed.append(a))
    assert timed == [] and all(row in again.target for row in table["target"])  # the run added its own
    # another grid point is timed, and only that
    wider = Grid(batch_sizes=(1, 2, 3), verify_lengths=(1, 2, 4), context_lens=(16, 64), budgets=(1, 3, 7, 15),
                 repeats=1)
    widened = measure_costs(target.model, strategies, lambda: list(range(20)), out, wider, lambda *a: timed.append(a))
    assert {r["batch"] for r in widened.target} == {1, 2, 3}
    assert len(timed) == 2 * 5 + 3  # batch 3: two contexts x (3 chain + 2 tree lengths), 3 overhead lengths
    # another dtype is another table
    half = target.model.to(torch.bfloat16)
    assert table_path(out, table_key(half)) != Path(table["path"])
    target.model.to(torch.float32)


def test_batched_run(measured):
    _, report, out = measured
    results = {(r["strategy"], r["batch_size"]): r for r in report["results"]}
    assert set(results) == {(s, b) for s in ("ar", "ngram", "draft") for b in (1, 2)}
    assert all(r["mismatches"] == 0 and r["prompts"] == 3 for r in results.values())  # batched ar too, vs batch 1
    run_dir = Path(report["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 3 * 2
    batched = [r for r in rows if r["batch_size"] == 2]
    assert sorted(r["batch_rows"] for r in batched if r["strategy"] == "ar") == [1, 2, 2]  # the last batch is short
    by_prompt = {(r["strategy"], r["prompt_id"], r["batch_size"]): r["output_ids"] for r in rows}
    assert all(by_prompt[(s, p, 2)] == by_prompt[("ar", p, 1)] for s, p, _ in by_prompt)
    load = report["load"]
    assert {(p["strategy"], p["batch_size"]) for p in load["points"]} == {(s, b) for s in ("ngram", "draft")
                                                                         for b in (1, 2)}
    assert all(p["modelled_speedup"] > 0 and p["measured_speedup"] > 0 for p in load["points"])
    assert "modelled" in results[("draft", 2)] and results[("draft", 2)]["modelled"]["speedup"] > 0
    assert set(load["stops_paying"]) == {"ngram", "draft"}
    assert load_config_file(run_dir / "draft_schedule.toml")["draft_schedule"].keys() == {"ngram", "draft"}
    for plot in ("speedup_by_batch.png", "verify_cost.png"):
        assert (run_dir / plot).stat().st_size > 1000


def test_batched_run_table_and_resume(measured):
    _, report, _ = measured
    run_dir = Path(report["run_dir"])
    lines = (run_dir / "rows.jsonl").read_text().splitlines()
    # interrupted in the middle of the last batch's rows
    (run_dir / "rows.jsonl").write_text("\n".join(lines[:-4]) + "\n" + lines[-4][:40])
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))
    result = invoke("run", "--resume", run_dir)
    assert result.exit_code == 0, result.output
    assert len((run_dir / "rows.jsonl").read_text().splitlines()) == len(lines)
    assert "B=1" in result.stdout and "B=2" in result.stdout and "x (" in result.stdout  # measured beside modelled
    assert "where speculation stops paying" in result.stdout


def test_batch_larger_than_the_suite_uses_what_there_is(tiny_model_dir, tmp_path):
    result = invoke("run", "--model", tiny_model_dir, "-s", "ngram", "--batch-size", 8, "--limit", 3,
                    "--max-new-tokens", 4, "--out", tmp_path, "--json", "--warmup", 0)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {r["batch_size"] for r in report["results"]} == {3}
    assert report["notes"] == ["batch size 8 is more than the 3 prompts selected: batch size 3 is measured instead"]
    assert "note: batch size 8 is more than the 3 prompts" in result.stderr


def test_draft_schedule_caps_the_drafts(tiny_model_dir, tiny_draft_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[knobs.draft]\nk = 4\n[draft_schedule.draft]\nbatch_sizes = [1, 2]\ndraft_tokens = [2, 0]\n")
    result = invoke("run", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, "-s", "draft", "--config", config,
                    "--batch-sizes", "1,2", "--limit", 2, "--max-new-tokens", 6, "--out", tmp_path, "--json",
                    "--warmup", 0)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (Path(json.loads(result.stdout)["run_dir"]) / "rows.jsonl").open()]
    drafts = [r for r in rows if r["strategy"] == "draft"]
    assert all(len(r["steps_by_drafted"]) == 3 for r in drafts if r["batch_size"] == 1)  # at most 2 drafts
    assert all(r["drafted"] == 0 and r["tau"] == 1 for r in drafts if r["batch_size"] == 2)  # plain decoding


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0,1"], "--batch-sizes 0,1: every size must be an integer of at least 1"),
    (["--batch-sizes", ""], "--batch-sizes names no size"),
    (["--batch-sizes", "4,2"], "increasing order"),
    (["--batch-sizes", "1,x"], "comma list of integers"),
    (["--batch-size", 2, "--batch-sizes", "1,2"], "not both"),
    (["-s", "eagle", "--batch-size", 2], "eagle verify token trees, which run at batch size 1 only"),
    (["-s", "ngram,dflash+dspark", "--batch-sizes", "1,4"], "dflash+dspark verify token trees"),
])
def test_bad_batch_input_is_one_line(args, message, tmp_path):
    result = invoke("run", *args, "--limit", 4, "--out", tmp_path)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "2,1"], "--batch-sizes 2,1: list the sizes in increasing order"),
    (["--verify-lengths", "0,4"], "--verify-lengths 0,4: every size must be an integer of at least 1"),
    (["--context-lens", ""], "--context-lens names no size"),
    (["--context-lens", "64,1020"], "beyond the model's maximum of 1024 positions"),
    (["--strategy", "nope"], "unknown strategy"),
])
def test_bad_cost_input_is_one_line(args, message, tiny_model_dir, tmp_path):
    result = invoke("costs", "--model", tiny_model_dir, *args, "--out", tmp_path)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]  # after transformers' bar
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output
