"""`--engine vllm` and `--engine both` against real vLLM on the embedded model (head size 64, which
vLLM's CPU attention takes) and its drafters, converted to vLLM's layouts.

One `--engine both` run serves most tests: every strategy vLLM runs here, in both engines. vLLM
starts its engine core in a process of its own, as users run it (in-process engines of one
interpreter interfere: each new one rebinds kernels across every module loaded, including the
numba that vLLM's ngram proposer loads), so each engine costs a process start: tests share them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specbench.bench.measuring import make_row
from specbench.bench.pipeline import measure_run
from specbench.bench.prepare import prepare
from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.engines import vllm as vllm_backend
from specbench.engines.protocol import EnginePlan
from specbench.engines.vllm import VLLM
from specbench.methods.registry import definitions
from specbench.plan.run_config import RunConfig
from specbench.report.run_dir import RunDir

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_installed", "drafter_cache")]
# everything vLLM runs for this target on a CPU: vLLM's V1 model runner (the CPU's, without Triton) has no dspark
STRATEGIES = ["ngram", "draft", "eagle", "dflash"]
runner = CliRunner()
# 10k tokens of the embedded model (engines share 24 GB), and eager mode: the tests keep vLLM's start-up short
# (compiling takes minutes per engine here); a run's default is vLLM's own, compiled
ENGINE_ARGS = {"kv_cache_memory_bytes": 64 << 20, "enforce_eager": True}


@pytest.fixture(scope="module")
def drafter_cache(tmp_path_factory):
    """The converted drafters go to a cache of the tests' own, not the user's. vLLM's own cache stays where
    vLLM keeps it: it holds what vLLM learnt of each model class, which costs a Python process per class
    (half a minute on a loaded machine) wherever the cache is new."""
    with pytest.MonkeyPatch.context() as patch:
        users_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        patch.setenv("VLLM_CACHE_ROOT", os.environ.get("VLLM_CACHE_ROOT") or str(users_cache / "vllm"))
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def both(drafter_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("both")
    config = RunConfig(strategies=STRATEGIES, engine="both", limit=2, max_new_tokens=24, warmup=0,
                       out=str(out), engine_args=ENGINE_ARGS)
    bench = prepare(config.plan())
    try:
        run = RunDir.create(config.out, bench.config, bench.target.name, bench.suite.name,
                            [s.label for s in bench.runs])
        report = measure_run(bench, run, None, None).as_json()
        rows = [json.loads(line) for line in (run.path / "rows.jsonl").read_text().splitlines()]
        log = bench.backends[VLLM].engine.log.read_text()
        yield {"report": report, "rows": rows, "bench": bench, "log": log}
    finally:
        bench.close()


def summary_of(report: dict, strategy: str, engine: str) -> dict:
    return next(r for r in report["results"] if r["strategy"] == strategy and r["engine"] == engine)


def test_every_strategy_runs_in_both_engines_losslessly(both):
    report = both["report"]
    for strategy in ["ar", *STRATEGIES]:
        for engine in ("specbench", VLLM):
            summary = summary_of(report, strategy, engine)
            assert summary["prompts"] == 2
            if strategy != "ar":
                assert summary["mismatches"] == 0, (strategy, engine)  # greedy, against the same engine's ar
    assert {r["engine"] for r in both["rows"]} == {"specbench", VLLM}


def test_vllm_figures_come_from_its_own_counters(both):
    report = both["report"]
    for strategy in ("eagle", "dflash"):  # the trained drafters accept in vLLM as they do here
        assert summary_of(report, strategy, VLLM)["tau"] > 1.5
    for row in both["rows"]:
        if row["engine"] != VLLM:
            continue
        if row["strategy"] == "ar":
            assert row["drafted"] == 0 and row["steps"] == row["new_tokens"]
            continue
        # per request: accepted per position is a non-increasing count of steps, summing to the accepted drafts
        counts = row["accept_by_position"]
        assert counts == sorted(counts, reverse=True) and sum(counts) == row["accepted"] <= row["drafted"]
        assert row["steps"] > 1 and row["wall_s"] > 0 and row["ttft_s"] > 0
        # each forward commits a token and what it accepted, steps that drafted nothing (ngram) included
        assert row["steps"] > row["drafts"] and row["steps"] + row["accepted"] >= row["new_tokens"]


def test_per_position_acceptance_matches_vllms_own_counters(both):
    """The unconditional per-position rate is the one vLLM's `vllm:spec_decode_*` counters give (accepted at
    position k / drafts, as `vllm bench serve` computes it). Those counters are process-wide and each new
    engine re-registers them, so they hold the last engine started: compared for that one."""
    last = both["bench"].backends[VLLM].engine.runners[-1]
    metrics = {m.name: m for m in last.llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    drafts = metrics["vllm:spec_decode_num_drafts"].value
    per_position = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    summary = summary_of(both["report"], last.name, VLLM)
    rates = summary["acceptance_rate_by_position"]
    assert drafts > 0 and len(rates) <= len(per_position)
    assert rates + [0.0] * (len(per_position) - len(rates)) == pytest.approx([a / drafts for a in per_position])
    assert sum(r["drafts"] for r in both["rows"] if r["engine"] == VLLM and r["strategy"] == last.name) == drafts
    conditional = summary["conditional_acceptance_by_position"]  # the other form, from the same counts
    assert conditional[1:] == pytest.approx([b / a for a, b in zip(per_position, per_position[1:len(conditional)])])


def test_the_cost_model_predicts_each_engine_from_its_own_forwards(both):
    """Each engine's strategies are priced with the target's forwards as that engine runs them (vLLM's timed
    through its `ar` engine's requests) and the same drafters' proposals."""
    for strategy in STRATEGIES:
        own, vllm = (summary_of(both["report"], strategy, e)["cost_model"] for e in ("specbench", VLLM))
        for model in (own, vllm):
            assert model["predicted_speedup"] > 0 and model["verify_s"] > 0 and model["draft_s"] >= 0
        assert vllm["ar_step_s"] != own["ar_step_s"]  # a table of vLLM's own
        assert vllm["tau"] == summary_of(both["report"], strategy, VLLM)["tau"]


def test_vllms_forwards_are_timed_after_a_cached_prefix(both):
    """What time_target rests on: vLLM computes only what a prompt adds to one it served (prefix caching, in
    whole blocks), so each timed request pays for its new tokens alone."""
    from vllm import SamplingParams

    backend = both["bench"].backends[VLLM]
    ar = next(r for r in backend.engine.runners if r.name == "ar")
    block = ar.llm.llm_engine.vllm_config.cache_config.block_size
    timed = backend.target_costs([1, block + 1], [1, 4], repeats=2, warmup=0)
    assert sorted({t.context for t in timed}) == [block, 2 * block]  # rounded up to whole blocks
    assert all(len(t.seconds) == 2 and all(s > 0 for s in t.seconds) for t in timed if t.tokens == 1)
    prefix = list(range(100, 100 + block))
    for new, cached in ((1, 0), (4, block)):  # the first request caches the prefix's block
        out, _ = ar.request(prefix + [7] * new, SamplingParams(max_tokens=1))
        assert out.num_cached_tokens == cached


def test_what_vllm_prints_goes_to_the_runs_log(both):
    """vLLM's logging, its engine processes' included, goes to the log, at INFO; each engine's start-up is
    recorded, with what of it was compiling (nothing, in the tests' eager mode)."""
    assert "INFO" in both["log"] and "init engine (profile, create kv cache, warmup model) took" in both["log"]
    (report,) = [r for r in both["report"]["engines"] if r["engine"] == VLLM]
    assert set(report["start_s"]) == {"ar", *STRATEGIES} and all(s > 0 for s in report["start_s"].values())
    assert report["details"]["compile_s"] == {name: 0.0 for name in ("ar", *STRATEGIES)}


def test_vllms_processes_run_as_its_cpu_guide_deploys_them(both):
    """TCMalloc and Intel OpenMP loaded in every engine process (read from /proc), its threads bound, and vLLM's
    own check finds both in LD_PRELOAD (it warns where it does not)."""
    from specbench.engines.vllm_cpu import IOMP, TCMALLOC

    (report,) = [r for r in both["report"]["engines"] if r["engine"] == VLLM]
    runtime = report["details"]["cpu_runtime"]
    assert runtime["loaded"] == {TCMALLOC: True, IOMP: True}
    assert runtime["VLLM_CPU_OMP_THREADS_BIND"] == "auto" and "not found in LD_PRELOAD" not in both["log"]


def test_an_eager_engine_is_not_calibrated_as_one_that_compiles(both):
    """The tests' engines run eagerly: their warm-up is not repeated until it settles (bench/decode_groups.py)."""
    bench = both["bench"]
    assert [bench.backends[VLLM].compiles(s) for s in bench.engine_strategies] == [False] * (1 + len(STRATEGIES))


def test_vllm_runs_as_deployed_unless_told(tmp_path):
    """No enforce_eager of specbench's: vLLM's defaults compile (and capture CUDA graphs on a GPU)."""
    from specbench.engines.vllm import engine_kwargs, log_of

    kwargs = engine_kwargs(str(tmp_path), torch.float32, 0, {})
    assert "enforce_eager" not in kwargs and log_of(kwargs).parent == Path(tempfile.gettempdir())
    assert engine_kwargs(str(tmp_path), torch.float32, 0, {"enforce_eager": True})["enforce_eager"] is True


def test_the_log_joins_the_run_directory_after_an_interrupted_runs(tmp_path):
    import logging

    from specbench.engines.vllm import VllmEngine, engine_kwargs

    for attempt in ("first", "resumed"):
        engine = VllmEngine(engine_kwargs(str(tmp_path), torch.float32, 0, {}))
        logging.getLogger("vllm.test").warning("%s attempt", attempt)
        engine.keep_log(tmp_path)
        assert not engine.log.exists() and not engine.log.with_suffix(".json").exists()
    lines = (tmp_path / "vllm.log").read_text().splitlines()
    assert [line.split(": ")[-1] for line in lines] == ["first attempt", "resumed attempt"]


def test_a_refusal_is_one_line_with_vllms_output_in_its_log(tmp_path):
    """The command a user types, in a process of its own (vLLM's engine processes write to the terminal's
    file descriptors, which an in-process runner does not capture)."""
    env = {**os.environ, "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"], "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "specbench", "run", "--engine", "both", "--strategy", "dspark", "--limit", "1",
               "--out", str(tmp_path / "results")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "error: vLLM refused dspark: Model Runner V1 does not support: dspark speculative " \
                                  "decoding" and done.stdout == ""
    assert not (tmp_path / "results").exists()
    (log,) = tmp_path.glob("specbench-vllm-*.log")
    assert "WARNING" in log.read_text() and "speculative" in log.read_text()  # the check's own warnings


def test_idle_engines_are_stopped_while_another_is_timed(both):
    """Between its own requests every engine's processes are stopped, so none busy-polls beside the timed one."""
    import psutil

    runners = both["bench"].backends[VLLM].engine.runners
    assert len(runners) == 1 + len(STRATEGIES) and all(runner.processes for runner in runners)
    for runner in runners:
        assert {p.status() for p in runner.processes} == {psutil.STATUS_STOPPED}, runner.name
        assert {p.name() for p in runner.processes} >= {"VLLM::EngineCore", "VLLM::Worker"}
    (report,) = [r for r in both["report"]["engines"] if r["engine"] == VLLM]
    assert report["details"]["idle_engines"] == "stopped (SIGSTOP) outside their own requests"


def test_transfer_and_engine_agreement(both):
    report = both["report"]
    for strategy in STRATEGIES:
        vllm, own = summary_of(report, strategy, VLLM), summary_of(report, strategy, "specbench")
        assert vllm["transfer"] == pytest.approx(vllm["speedup"] / own["speedup"])
    agreement = summary_of(report, "ar", VLLM)["engine_agreement"]
    assert agreement["prompts"] == 2 and 0 <= agreement["agreeing"] <= 2
    assert len(agreement["first_divergence"]) == 2 - agreement["agreeing"]


def test_the_table_shows_each_engine_and_the_transfer(both):
    run_dir = both["report"]["run_dir"]
    result = runner.invoke(app, ["report", run_dir, "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert "| ngram@vllm |" in result.stdout and "| ngram |" in result.stdout and "transfer" in result.stdout


def test_the_lossless_check_catches_a_planted_mismatch(both):
    bench = both["bench"]
    ar, ngram = (next(s for s in bench.engine_strategies if s.name == name) for name in ("ar", "ngram"))
    prompt = [int(t) for t in bench.target.tokenizer.encode("def add(a, b):\n    return")]
    reference = ar.runner(prompt, 12, bench.sampling, 0).tokens
    gen = ngram.runner(prompt, 12, bench.sampling, 0)
    assert gen.tokens == reference
    planted = dataclasses.replace(gen, tokens=gen.tokens[:5] + [(gen.tokens[5] + 1) % 4096] + gen.tokens[6:])
    item = bench.suite.items[0]
    row = make_row(bench.target.model, ngram, item, 0, 0, prompt, planted, reference, 0)
    assert row.mismatch is True and row.first_divergence == 5 and row.engine == VLLM
    assert make_row(bench.target.model, ngram, item, 0, 0, prompt, gen, reference, 0).mismatch is False


def test_each_method_translates_to_fields_vllm_takes():
    from vllm.config import SpeculativeConfig

    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    for name, method in definitions().items():
        serving = method.serving(method.options(), method.default_controller, None)
        assert set(serving.vllm) <= fields, name
        assert set(serving.vllm_missing) <= {f.name for f in dataclasses.fields(method.options)} | {"controller"}


BAD = [
    (["--engine", "nosuch"], "--engine nosuch: expected specbench, vllm, both"),
    (["--engine", "vllm", "--strategy", "eagle+dflash"], "eagle+dflash combine drafters, which vLLM cannot run"),
    (["--engine", "vllm", "--strategy", "eagle", "--set", "eagle.top_k=4"], "eagle's top_k has no vLLM counterpart"),
    (["--engine", "vllm", "--strategy", "ngram", "--controller", "heuristic"], "ngram's controller has no vLLM"),
    (["--engine", "vllm", "--strategy", "mtp"], "mtp runs in vLLM only from MTP layers inside the target"),
    (["--engine", "vllm", "--strategy", "ngram", "--engine-args", "{not json"], "--engine-args is not JSON"),
    (["--engine", "vllm", "--strategy", "ngram", "--engine-args", "[1, 2]"], "--engine-args must be a JSON object"),
    (["--engine", "vllm", "--strategy", "ngram", "--engine-args", '{"no_such_argument": 1}'],
     "vLLM has no engine argument no_such_argument"),
    (["--engine-args", '{"max_model_len": 512}'], "they need --engine vllm or both"),
    (["--engine", "vllm", "--strategy", "ngram", "--engine-args", '{"speculative_config": {}}'],
     "speculative_config come from the run"),
    (["--engine", "vllm", "--strategy", "ngram", "--batch-size", "4"], "measures batch size 1 only"),
    (["--engine", "vllm", "--strategy", "dspark"], "vLLM refused dspark: Model Runner V1 does not support"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[m for _, m in BAD])
def test_bad_engine_input_is_one_line_exit_2_nothing_written(args, message, tmp_path):
    result = runner.invoke(app, ["run", *args, "--out", str(tmp_path / "results")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "results").exists()


def test_without_vllm_the_engine_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(vllm_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecbenchError, match=r'pip install -e "\.\[vllm\]"'):
        vllm_backend.VllmBackend.check(EnginePlan((), {}, None, [1], 0.0, {}, "", "auto", "auto", 0, {}, {}))


def test_tune_on_vllm_writes_a_speculative_config_vllm_accepts(tmp_path):
    from vllm import LLM

    result = runner.invoke(app, ["tune", "--engine", "vllm", "--strategy", "ngram", "--trials", "2", "--limit", "3",
                                 "--engine-args", json.dumps(ENGINE_ARGS),
                                 "--max-new-tokens", "16", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["trials"]["counted"] == 2 and record["best_value"] > 0
    config = json.loads(Path(record["vllm_config"]).read_text())
    assert config["method"] == "ngram"
    assert config["num_speculative_tokens"] == record["knobs"]["ngram"].get("num_pred_tokens", 8)
    assert "controller" not in record["best_params"]  # vLLM drafts a fixed length: the controller is not searched
    llm = LLM(model=str(Path(__file__).resolve().parents[1] / "specbench/assets/default/target"), dtype="float32",
              max_model_len=512, speculative_config=config, **ENGINE_ARGS)
    llm.llm_engine.engine_core.shutdown()
