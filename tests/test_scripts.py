"""Every script in scripts/ runs end to end on a tiny configuration: the tiny target and draft LM of
tests/helpers.py, drafters built for them by scripts/build_default_drafters.py, a prompt or two of a few
tokens. The figures are meaningless; what is checked is that each script runs, writes what it says it
writes, and keeps its own checks (greedy mismatches, identical outputs) on the tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specbench.decoding.target import fingerprint, load_target
from specbench.methods.drafter_config import read_drafter_config
from tests.helpers import run_script

DRAFTERS = ("eagle", "mtp", "dflash", "dspark")


@pytest.fixture(scope="module")
def drafters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("drafters")
    with pytest.MonkeyPatch.context() as patch:
        run_script("build_default_drafters", "--model", tiny_model_dir, "--out", out, "--corpus-bytes", 100_000,
                   "--prompts", 4, "--answer-tokens", 8, "--steps", 2, monkeypatch=patch)
    return {name: out / name for name in DRAFTERS}


def test_build_default_drafters(drafters, tiny_model_dir):
    target = fingerprint(load_target(str(tiny_model_dir), torch.device("cpu"), torch.float32).model)
    for name, path in drafters.items():
        config = read_drafter_config(path)
        assert (config["specbench_strategy"], config["target_fingerprint"]) == (name, target)
    record = json.loads((drafters["eagle"].parent / "BUILD.json").read_text())
    assert set(record) == set(DRAFTERS) and all(r["steps"] == 2 for r in record.values())


def test_build_default_model(tmp_path, monkeypatch):
    run_script("build_default_model", "--out", tmp_path, "--corpus-bytes", 100_000, "--target-steps", 1,
               "--draft-steps", 1, monkeypatch=monkeypatch)
    for part in ("target", "draft"):
        assert AutoModelForCausalLM.from_pretrained(tmp_path / part).num_parameters() > 0
    record = json.loads((tmp_path / "BUILD.json").read_text())
    assert record["target"]["steps"] == record["draft"]["steps"] == 1


def test_bench_fastpath(tiny_model_dir, tiny_draft_dir, tmp_path, monkeypatch):
    run_script("bench_fastpath", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, "--limit", 1,
               "--max-new-tokens", 4, "--rounds", 1, "--strategy", "ar", "--strategy", "draft",
               "--out", tmp_path / "fastpath.json", monkeypatch=monkeypatch)
    rows = json.loads((tmp_path / "fastpath.json").read_text())["strategies"]
    assert set(rows) == {"ar", "draft"}
    assert all(row["prompts_differing"] == {"flat": 0, "packed": 0} for row in rows.values())


def test_bench_foundation(tiny_model_dir, tiny_draft_dir, tmp_path, monkeypatch):
    run_script("bench_foundation", "--model", tiny_model_dir, "--drafter", tiny_draft_dir, "--limit", 2,
               "--max-new-tokens", 4, "--out", tmp_path / "figures", monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "figures" / "foundation.json").read_text())
    for key in ("a_draft_vs_transformers", "b_ngram_vs_transformers"):
        assert figures[key]["identical_outputs"] == "2/2", figures[key]
    assert all(s["mismatches"] in (0, None) for s in figures["summary"])
    assert (tmp_path / "figures" / "foundation.md").is_file()


def test_bench_drafters(tiny_model_dir, tiny_draft_dir, drafters, tmp_path, monkeypatch):
    run_script("bench_drafters", "--model", tiny_model_dir, "--drafter", tiny_draft_dir,
               *[arg for path in drafters.values() for arg in ("--drafter", path)], "--limit", 1,
               "--max-new-tokens", 4, "--sampled-limit", 1, "--out", tmp_path / "figures", monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "figures" / "drafters.json").read_text())
    assert figures["mismatches"] and not any(figures["mismatches"].values())  # greedy: every strategy is lossless
    assert set(figures["sampled_combinations"]) == {"temperature 1", "temperature 0"}
    assert (tmp_path / "figures" / "drafters.md").is_file()


def test_bench_batch(tiny_model_dir, tmp_path, monkeypatch):
    run_script("bench_batch", "--model", tiny_model_dir, "--strategies", "ngram", "--smoke", "--limit", 2,
               "--max-new-tokens", 4, "--batch-sizes", "1,2", "--out", tmp_path, monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "batch.json").read_text())
    assert figures["complete"] and figures["mismatches"] == {"ar@1": 0, "ngram@1": 0, "ar@2": 0, "ngram@2": 0}
    assert set(figures["gpu_crossover_modelled"]["ngram"]) == {"rtx4090", "h100-sxm"}
    assert (tmp_path / "batch.md").is_file()


def test_bench_recommend(tiny_model_dir, tiny_draft_dir, drafters, tmp_path, monkeypatch):
    run_script("bench_recommend", "--model", tiny_model_dir, "--drafter", tiny_draft_dir,
               *[arg for path in drafters.values() for arg in ("--drafter", path)], "--categories", "code,chat",
               "--per-half", 1, "--max-new-tokens", 4, "--out", tmp_path / "figures", "--work", tmp_path / "work",
               monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "figures" / "recommend.json").read_text())
    assert [(w["category"], w["batch_size"]) for w in figures["workloads"]] == [
        ("code", 1), ("code", 4), ("chat", 1), ("chat", 4)]
    # at batch 1 the evidence half answers; at batch 4 its 2 prompts ran at batch 2, which answers nothing
    assert [w["source"] for w in figures["workloads"]] == ["measured", "prior", "measured", "prior"]
    assert all(w["loss"] <= 1 for w in figures["workloads"])


def test_bench_tune(tiny_model_dir, drafters, tmp_path, monkeypatch):
    run_script("bench_tune", "--model", tiny_model_dir, "--drafter", drafters["dspark"], "--limit", 4,
               "--max-new-tokens", 4, "--seeds", 1, "--study-trials", 2, "--rounds", 1, "--out", tmp_path,
               monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "tune.json").read_text())
    assert figures["grid_points"] == 63 and len(figures["measured"]["tpe"]) == 1
    assert figures["study"]["trials"]["counted"] == 2


def test_bench_stability(tiny_model_dir, tmp_path, monkeypatch):
    """Two runs of specbench's engine (vLLM's preloads need vLLM: its modes run the same here)."""
    run_script("bench_stability", "--engine", "specbench", "--strategies", "ngram", "--limit", 3,
               "--max-new-tokens", 4, "--runs", 2, "--preload", "both", "--model", tiny_model_dir,
               "--out", tmp_path / "figures", monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "figures" / "stability.json").read_text())
    assert [r["mode"] for r in figures["runs"]] == ["deployed", "no-preload", "no-preload", "deployed"]
    ngram = figures["deployed"]["ngram"]
    assert len(ngram["speedups"]) == 2 and ngram["spread"] >= 0 and ngram["worst_unflagged"] >= 1
    assert figures["deployed"]["ar"]["spread"] is None  # ar's speedup is 1 by definition
    assert "| ngram |" in (tmp_path / "figures" / "stability.md").read_text()


@pytest.mark.slow  # two vLLM engines start (over two minutes on 2 cores); test_vllm_engine.py covers the engine
@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_installed")
def test_bench_engines(tmp_path, monkeypatch):
    """On the embedded model: vLLM's CPU attention takes head size 64, which the tiny models do not have (ngram:
    no drafter to convert into vLLM's layouts)."""
    run_script("bench_engines", "--strategies", "ngram", "--limit", 1, "--max-new-tokens", 4,
               "--engine-args", json.dumps({"kv_cache_memory_bytes": 64 << 20}), "--out", tmp_path / "figures",
               monkeypatch=monkeypatch)
    figures = json.loads((tmp_path / "figures" / "engines.json").read_text())
    assert figures["engine_agreement"]["prompts"] == 1
    assert figures["strategies"]["ngram"]["specbench"]["mismatches"] == 0
    assert figures["strategies"]["ngram"]["vllm"]["mismatches"] == 0


@pytest.mark.slow  # a vLLM engine and two servers start (minutes on 2 cores)
@pytest.mark.vllm
@pytest.mark.usefixtures("vllm_installed")
def test_serve_tau(tmp_path, monkeypatch, capsys):
    """run's vLLM engine and an ngram server count the same drafts and accepted tokens on the same prompt."""
    run_script("serve_tau", "--limit", 1, "--max-new-tokens", 8, "--out", tmp_path, monkeypatch=monkeypatch)
    figures = json.loads(capsys.readouterr().out)
    for key in ("drafts", "accepted", "tokens", "tau_per_drafting_step", "tokens_per_forward"):
        assert figures["run"][key] == figures["serve"][key], key
    assert figures["run"]["summary_tau"] == pytest.approx(figures["run"]["tokens_per_forward"])
