"""Warm-ups that cover what is measured (bench/decode_groups.py `warm_up`): the shortest and the longest measured
prompts warmed, an engine that compiles warmed until two passes agree (pyperf's calibration, with a cap), and what
each warm-up covered recorded in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

from specbench.bench.decode_groups import settled, timed_passes
from specbench.engines.specbench import SpecbenchBackend
from tests.helpers import invoke


def passes_of(times: list[float], least: int, most: int, calibrate: bool) -> list[float]:
    queue = iter(times)
    return timed_passes(lambda: next(queue), least, most, calibrate)


def test_a_compiling_engine_is_warmed_until_two_passes_agree_within_ten_percent():
    compiling = [5.0, 1.0, 0.5, 0.47, 0.3]
    assert passes_of(compiling, 1, 10, calibrate=True) == [5.0, 1.0, 0.5, 0.47]
    assert passes_of(compiling, 1, 3, calibrate=True) == [5.0, 1.0, 0.5]  # the cap
    assert passes_of(compiling, 2, 10, calibrate=False) == [5.0, 1.0]  # another engine: --warmup passes
    assert passes_of(compiling, 0, 10, calibrate=False) == []
    assert settled([1.0, 1.09]) and settled([1.09, 1.0]) and not settled([1.0, 1.11]) and not settled([1.0])


def run_json(tiny_model_dir, tmp_path, *args) -> tuple[dict, list[dict]]:
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 3, "--max-new-tokens", 4,
                    "--no-cost-model", "--out", tmp_path, "--json", *args)
    assert result.exit_code == 0, result.output
    run = Path(json.loads(result.stdout)["run_dir"])
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    return json.loads((run / "summary.json").read_text()), rows


def test_each_strategy_is_warmed_on_the_shortest_and_the_longest_prompt(tiny_model_dir, tmp_path):
    summary, rows = run_json(tiny_model_dir, tmp_path, "--warmup", 2)
    lengths = sorted(r["prompt_tokens"] for r in rows if r["turn"] == 0 and r["strategy"] == "ar")
    assert lengths[0] < lengths[-1]  # the suite's prompts differ: both ends are warmed
    assert [(w["strategy"], w["batch_size"], w["prompt_tokens"], w["passes"], w["settled"])
            for w in summary["warmup"]] == [(s, 1, [lengths[0], lengths[-1]], [2, 2], None) for s in ("ar", "ngram")]
    assert all(w["seconds"] >= sum(w["last_s"]) > 0 for w in summary["warmup"])


def test_an_engine_that_compiles_is_calibrated_up_to_the_cap(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(SpecbenchBackend, "compiles", lambda self, strategy: True, raising=False)
    summary, _ = run_json(tiny_model_dir, tmp_path, "--warmup", 1, "--warmup-cap", 3)
    for warmed in summary["warmup"]:
        assert isinstance(warmed["settled"], bool)
        assert all(2 <= n <= 3 for n in warmed["passes"])  # two at least to compare, three at most
        if not warmed["settled"]:
            assert any(f"{warmed['strategy']}'s warm-up did not settle within 3 passes" in n for n in summary["notes"])


def test_no_warm_up_records_none_even_in_an_engine_that_compiles(tiny_model_dir, tmp_path, monkeypatch):
    import specbench.bench.decode_groups as decode_groups

    calls = []
    monkeypatch.setattr(SpecbenchBackend, "compiles", lambda self, strategy: True, raising=False)
    monkeypatch.setattr(decode_groups, "timed_decode", lambda *args: calls.append(args) or 1.0)
    summary, _ = run_json(tiny_model_dir, tmp_path, "--warmup", 0)
    assert calls == []  # no pass at all, not calibrated from none
    assert "warmup" not in summary


def test_garbage_collection_waits_while_a_group_decodes(tiny_model_dir, tmp_path, monkeypatch):
    """A full collection walks every live object of the process: it must not land inside a timed decoding."""
    import gc

    seen = []
    decode = SpecbenchBackend.decode
    monkeypatch.setattr(SpecbenchBackend, "decode", lambda *a, **k: seen.append(gc.isenabled()) or decode(*a, **k))
    run_json(tiny_model_dir, tmp_path)
    assert seen and not any(seen) and gc.isenabled()
