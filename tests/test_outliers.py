"""Outliers caught and measured again (analysis/stats.py `outliers`, bench/remeasure.py): the rule by hand, and a
run in which one prompt stalls and another logs a compilation: each is flagged, measured again, reported with
both timings in its row, its summary and the table, and the speedup uses the second timing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from specbench.analysis.stats import outlier_threshold, outliers
from specbench.engines.vllm import stall_lines
from tests.helpers import invoke

# the issue's run: seven prompts of dflash@vllm at 0.10-0.27 s, one at 5.15 s, all 64 tokens
ISSUE = [0.10, 0.12, 0.15, 0.18, 0.21, 0.24, 0.27, 5.15]


def frame(walls, strategy="dflash", engine="vllm", tokens=64):
    return pd.DataFrame({"strategy": strategy, "engine": engine, "batch_size": 1, "new_tokens": tokens,
                         "wall_s": walls, "prompt_id": [f"p{i}" for i in range(len(walls))]})


def test_the_issues_stall_is_the_one_prompt_flagged():
    assert outliers(frame(ISSUE), 5.0).tolist() == [False] * 7 + [True]


def test_the_threshold_is_median_plus_k_scaled_mads_by_hand():
    per_token = pd.Series([1.0, 2.0, 3.0, 4.0, 100.0]).to_numpy()
    # median 3, |x - 3| = 2 1 0 1 97: raw MAD 1, scaled 1.4826
    assert outlier_threshold(per_token, 2.0) == pytest.approx(3 + 2 * 1.4826, rel=1e-4)


def test_equal_times_flag_no_prompt_for_a_tiny_excess_and_few_rows_flag_none():
    assert not outliers(frame([1.0] * 7 + [1.1]), 5.0).any()  # MAD 0: counted as 5% of the median
    assert outliers(frame([1.0] * 7 + [1.3]), 5.0).iloc[-1]
    assert not outliers(frame([0.1, 5.0]), 5.0).any()  # two prompts: no median to stand out from


def test_each_strategy_is_judged_against_its_own_prompts():
    rows = pd.concat([frame([1.0] * 4, "ar"), frame([0.2, 0.2, 0.2, 0.9], "ngram"),
                      frame([0.9] * 4, "ngram", engine="specbench")])
    assert rows.pipe(outliers, 5.0).tolist() == [False] * 7 + [True] + [False] * 4


def test_a_larger_k_flags_less():
    walls = [1.0, 1.1, 1.2, 1.0, 1.1, 2.0]
    assert outliers(frame(walls), 3.0).iloc[-1] and not outliers(frame(walls), 20.0).iloc[-1]


def test_stall_lines_are_the_compilations_and_fallbacks_logged_after_the_mark(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO 12-06 04:00:00 [backends.py:1] Compiling a graph for dynamic shape takes 3 s\n")
    mark = log.stat().st_size
    with log.open("a") as file:
        file.write("INFO 12-06 04:00:01 [llm.py:1] Added request 3\n"
                   "WARNING 12-06 04:00:02 [cpu.py:1] Falling back to the torch SDPA path for a new shape\n"
                   "INFO 12-06 04:00:03 [backends.py:1] Compiling a graph for dynamic shape takes 1 s\n")
    assert stall_lines(log, mark) == ["WARNING 12-06 04:00:02 [cpu.py:1] Falling back to the torch SDPA path for a "
                                      "new shape", "INFO 12-06 04:00:03 [backends.py:1] Compiling a graph for dynamic "
                                      "shape takes 1 s"]
    assert stall_lines(log, log.stat().st_size) == [] and stall_lines(None, 0) == []


STALL_S = 2.0  # seconds added to one measured prompt's timing: far above a 4-token prompt of the tiny model


def test_a_stalled_prompt_is_measured_again_and_reported_with_both_timings(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.measuring as measuring

    real, calls = measuring.decode, []

    def stalling(bench, strategy, prompts, seeds, batch_size):
        """The real decoding; ngram's second measured prompt stalls, and its third logs a compilation."""
        decoded = real(bench, strategy, prompts, seeds, batch_size)
        if strategy.name == "ngram":
            calls.append(1)
            gen = decoded.sequences[0]
            if len(calls) == 2:
                decoded.sequences[0] = dataclasses.replace(gen, wall_s=gen.wall_s + STALL_S)
            if len(calls) == 3:
                decoded.sequences[0] = dataclasses.replace(gen, engine_log=["INFO Compiling a graph for shape 9"])
        return decoded

    monkeypatch.setattr(measuring, "decode", stalling)
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 5, "--max-new-tokens", 4,
                    "--no-cost-model", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    run = Path(json.loads(result.stdout)["run_dir"])
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    # a busy machine may flag another prompt by its time as well: the planted two are looked up by what they are
    again = [r for r in rows if "first_wall_s" in r and r["strategy"] == "ngram"]
    stalled = next(r for r in again if r["first_wall_s"] > STALL_S)
    logged = next(r for r in again if r["outlier"] == "INFO Compiling a graph for shape 9")
    assert stalled["outlier"] == "time" and stalled is not logged
    assert stalled["wall_s"] < stalled["first_wall_s"] - STALL_S / 2  # measured again, without the stall
    ar = next(r for r in rows if r["strategy"] == "ar" and r["prompt_id"] == stalled["prompt_id"])
    assert stalled["speedup"] == pytest.approx(ar["wall_s"] / stalled["wall_s"] * stalled["new_tokens"]
                                               / ar["new_tokens"])
    summary = next(s for s in json.loads((run / "summary.json").read_text())["results"] if s["strategy"] == "ngram")
    assert [(o["prompt_id"], o["cause"]) for o in summary["outliers"]] == [(r["prompt_id"], r["outlier"])
                                                                            for r in again]
    assert {"prompt_id": stalled["prompt_id"], "turn": 0, "repeat": 0, "first_wall_s": stalled["first_wall_s"],
            "wall_s": stalled["wall_s"], "cause": "time"} in summary["outliers"]
    table = invoke("report", run)
    assert "!" in table.stdout and "prompt(s) measured again (above median + 5 MAD" in table.output
    assert f"{stalled['prompt_id']} turn 0: {stalled['first_wall_s']:.2f} s, again" in table.output
