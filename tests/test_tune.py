"""`specbench tune` end to end on the embedded default model and on tiny local models.

Studies here are short (few prompts, few tokens, few trials) but real: real models, real timing,
real Optuna storages. The projected objective is deterministic, which makes pruning and resumption
checkable exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

import specbench.methods.base as base
from specbench.cli import app
from specbench.decoding.model_source import KNOWN_MODELS
from specbench.methods.registry import definition

runner = CliRunner()
STUDY = "e2e"
WORKLOAD = ["--limit", 8, "--max-new-tokens", 12, "--seed", 0]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def tune(out: Path, *args, study: str = STUDY, strategy: str = "dspark"):
    return invoke("tune", "--strategy", strategy, "--study", study, "--out", out, "--json", *WORKLOAD, *args)


def trials_of(out: Path, study: str = STUDY) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{out}/tuning/studies.db").get_trials()


@pytest.fixture(scope="module", autouse=True)
def float32_drafting_here():
    """The studies' figures as on a CPU without native bfloat16: the pruning test's planted worse trial is
    judged against trials measured so (bfloat16 drafting moves the embedded DSpark's acceptance a little)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "bf16_native", lambda device: False)
        yield


@pytest.fixture(scope="module")
def projected(tmp_path_factory):
    """A 3-trial dspark study projected onto the RTX 4090 profile."""
    out = tmp_path_factory.mktemp("tune")
    result = tune(out, "--gpu", "rtx4090", "--trials", 3)
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_study_record_toml_and_plots(projected):
    out, record = projected
    for key in ("study", "storage", "strategy", "model", "gpu", "projected", "objectives", "best_params",
                "best_value", "tuning", "holdout", "suite", "categories", "temperature", "max_new_tokens",
                "batch_size", "memory_bytes", "toml", "created"):
        assert key in record, key
    assert record["strategy"] == "dspark" and record["gpu"] == "rtx4090" and record["projected"] is True
    assert record["label"] == "projected on rtx4090"
    assert record["trials"]["counted"] == 3 and record["prompts"] == {"tuning": 6, "holdout": 2}
    assert set(record["holdout"]) >= {"tuned", "defaults"} and len(record["holdout"]["tuned"]["speedup_ci"]) == 2
    assert json.loads((out / "tuned" / f"{STUDY}.json").read_text())["best_params"] == record["best_params"]
    toml_text = Path(record["toml"]).read_text()
    assert "projected on rtx4090" in toml_text.splitlines()[0]
    tuned = tomllib.loads(toml_text)
    assert tuned["strategy"] == ["dspark"] and tuned["gpu"] == "rtx4090" and tuned["max_new_tokens"] == 12
    assert tuned["knobs"]["dspark"] == {k: v for k, v in record["best_params"].items() if k != "controller"}
    assert tuned["controller"] == record["best_params"]["controller"]
    assert "translation, not a measurement" in Path(record["engines_file"]).read_text()
    assert record["engines"]["vllm"]["speculative_config"]["num_speculative_tokens"] >= 1
    for plot in record["plots"]:
        assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {Path(p).stem for p in record["plots"]} >= {"history"}


def test_defaults_run_first_and_the_best_is_not_worse(projected):
    out, record = projected
    trials = trials_of(out)
    first = trials[0]
    assert first.user_attrs["defaults"] is True and record["defaults"]["trial"] == 0
    defaults = definition("dspark").options()
    assert first.params == {**{k: getattr(defaults, k) for k in first.params if k != "controller"},
                            "controller": "dspark"}
    assert record["best_value"] >= first.value
    # per-prompt values are stored and reported as intermediate values keyed by the prompt
    assert len(first.user_attrs["per_prompt"]) == 6 and len(first.intermediate_values) == 6
    assert sorted(first.intermediate_values) == list(range(6))


def test_the_defaults_are_the_drafting_knobs_the_drafter_carries(tmp_path):
    # what a run without knobs drafts with (build_member): the shape chosen for the drafter on its model
    drafter = tmp_path / "eagle"
    shutil.copytree(KNOWN_MODELS["default"].drafter_dir("eagle"), drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["drafting"] = {"depth": 3, "top_k": 1, "total_tokens": 4}
    (drafter / "config.json").write_text(json.dumps(config))
    result = tune(tmp_path, "--gpu", "rtx4090", "--trials", 1, "--drafter", drafter, strategy="eagle")
    assert result.exit_code == 0, result.output
    (first,) = trials_of(tmp_path)
    # and the knobs it carries none of at their defaults
    assert first.user_attrs["defaults"] is True and first.params == config["drafting"] | {"expand_above": 0.0}


def test_the_declared_space_reaches_the_study(projected):
    out, _ = projected
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{out}/tuning/studies.db")
    identity = study.user_attrs["specbench"]
    assert identity["space_text"] == definition("dspark").space.describe()
    for trial in study.trials:
        scheduled = {"window_size", "k_min", "k_max"} <= set(trial.params)
        assert scheduled == (trial.params["controller"] == "dspark")


def test_run_config_reads_the_tuned_toml(projected, tmp_path):
    _, record = projected
    result = invoke("run", "--config", record["toml"], "--limit", 1, "--max-new-tokens", 4, "--warmup", 0,
                    "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    saved = json.loads((Path(json.loads(result.stdout)["run_dir"]) / "config.json").read_text())
    assert saved["strategies"] == ["dspark"]
    assert saved["knobs"]["dspark"] == tomllib.loads(Path(record["toml"]).read_text())["knobs"]["dspark"]
    assert saved["controller"] == record["best_params"]["controller"]


def test_resume_adds_only_missing_trials_and_pruning_stops_a_worse_one(projected, tmp_path):
    src, _ = projected
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    again = tune(out, "--gpu", "rtx4090", "--trials", 3)
    assert again.exit_code == 0 and len(trials_of(out)) == 3  # already has its trials
    # a configuration clearly worse than the defaults on every prompt: two drafts per step, no scheduler
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{out}/tuning/studies.db")
    study.enqueue_trial({"block_size": 2, "confidence_threshold": 0.0, "context_window": 512, "controller": "fixed"})
    more = tune(out, "--gpu", "rtx4090", "--trials", 4)
    assert more.exit_code == 0, more.output
    last = trials_of(out)[-1]
    assert last.params["block_size"] == 2 and last.state == TrialState.PRUNED
    assert last.user_attrs["prompts"] < 6 and len(last.user_attrs["per_prompt"]) == last.user_attrs["prompts"]
    assert json.loads(more.stdout)["trials"]["pruning"]["prompts_skipped"] >= 1


@pytest.mark.parametrize("args, message", [
    (["--strategy", "ngram"], "tunes dspark, not ngram"),  # another strategy under the same name
    (["--max-new-tokens", 10], "max_new_tokens"),  # another workload
    (["--objectives", "speedup,memory"], "objectives"),
])
def test_a_study_asked_another_question_is_refused_and_untouched(projected, args, message):
    out, _ = projected
    before = [(t.number, t.state) for t in trials_of(out)]
    base = ["tune", "--study", STUDY, "--out", out, "--gpu", "rtx4090", "--trials", 5, *WORKLOAD]
    result = invoke(*base, *(["--strategy", "dspark"] if "--strategy" not in args else []), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert [(t.number, t.state) for t in trials_of(out)] == before


def test_another_search_space_is_refused(projected, tmp_path):
    out, _ = projected
    before = len(trials_of(out))
    config = tmp_path / "fixed.toml"  # a knob held fixed: the space has one dimension less
    config.write_text("[knobs.dspark]\nblock_size = 4\n")
    result = tune(out, "--gpu", "rtx4090", "--trials", 5, "--config", config)
    assert result.exit_code == 2 and "another search space" in result.output and "block_size" in result.output
    assert len(trials_of(out)) == before
    # a space whose declaration changed (as after editing a method module), on a copy of the study
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{copy}/tuning/studies.db")
    stored = study.user_attrs["specbench"]
    study.set_user_attr("specbench", {**stored, "space": "0" * 16,
                                      "space_text": {**stored["space_text"], "window_size": "32..128 log"}})
    result = tune(copy, "--gpu", "rtx4090", "--trials", 5)
    assert result.exit_code == 2 and "another search space" in result.output
    assert "window_size: 32..128 log here 16..256 log" in result.output
    assert len(trials_of(copy)) == before


def test_a_refused_study_never_imports_torch(projected, tmp_path):
    """In a fresh interpreter: a named study asked another question is refused before torch (which takes
    seconds to import) or any model is loaded (bad input: tests/test_bad_input.py)."""
    out, _ = projected
    args = ["tune", "--study", STUDY, "--out", str(out), "--strategy", "ngram", *map(str, WORKLOAD)]
    script = ("import json, sys\nfrom typer.testing import CliRunner\nfrom specbench.cli import app\n"
              "code = CliRunner().invoke(app, json.loads(sys.argv[1])).exit_code\n"
              "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"code": 2, "torch": False}


def test_config_file_with_unknown_keys_is_refused(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("trails = 3\n")
    result = invoke("tune", "--config", config, "--out", tmp_path)
    assert result.exit_code == 2 and "unknown key 'trails'" in result.output


def test_projected_memory_constraint_marks_trials_infeasible(tiny_model_dir, tmp_path):
    profiles = tmp_path / "gpus.toml"
    profiles.write_text("[profiles.tiny]\nmemory_gb = 0.0001\nbandwidth_gbs = 100\nbf16_tflops = 10\npcie_gen = 4\n")
    result = invoke("tune", "--model", tiny_model_dir, "--strategy", "ngram", "--gpu", "tiny", "--profiles", profiles,
                    "--trials", 2, "--limit", 3, "--max-new-tokens", 6, "--out", tmp_path, "--study", "tight", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["best_params"] is None and record["toml"] is None and "memory" in record["note"]
    assert record["trials"]["infeasible"] == record["trials"]["complete"] == 2
    for trial in trials_of(tmp_path, "tight"):
        assert trial.constraints["memory_gb"] > 0  # Optuna's constraint API, not a silent drop


def test_several_strategies_each_in_their_own_study_ranked(tiny_model_dir, tiny_draft_dir, tmp_path):
    result = invoke("tune", "--model", tiny_model_dir, "--strategy", "ngram",
                    "--trials", 2, "--limit", 3, "--max-new-tokens", 6, "--out", tmp_path, "--study", "one")
    assert result.exit_code == 0, result.output
    assert "best trial" in result.stdout and "| parameter" in result.stdout  # the summary, Markdown when piped
    # no progress bar when stderr is not a terminal: a line per finished trial instead
    lines = [line for line in result.stderr.splitlines() if line.startswith("one: trial ")]
    assert len(lines) == 2 and lines[0].startswith("one: trial 0 ") and ", best " in lines[0]
    assert lines[-1].endswith("(2 of 2 trials)")
    config = tmp_path / "two.toml"
    config.write_text(f'model = "{tiny_model_dir}"\ndrafters = ["{tiny_draft_dir}"]\nstrategy = ["ngram", "draft"]\n')
    result = invoke("tune", "--config", config, "--trials", 4, "--limit", 3, "--max-new-tokens", 6,
                    "--out", tmp_path, "--study", "pair", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["study"] for s in report["studies"]] == ["pair-ngram", "pair-draft"]
    assert [s["trials"]["counted"] for s in report["studies"]] == [2, 2]
    assert {r["strategy"] for r in report["ranking"]} == {"ngram", "draft"}
    tuned = [r["tuned"] for r in report["ranking"]]
    assert tuned == sorted(tuned, reverse=True)


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_two_workers_share_one_storage(storage, tiny_model_dir, tmp_path):
    url = f"sqlite:///{tmp_path}/s.db" if storage == "sqlite" else str(tmp_path / "journal.log")
    result = invoke("tune", "--model", tiny_model_dir, "--strategy", "ngram", "--workers", 2, "--trials", 6,
                    "--limit", 3, "--max-new-tokens", 8, "--storage", url, "--study", "shared", "--out", tmp_path,
                    "--json")
    assert result.exit_code == 0, result.output
    trials = optuna.load_study(study_name="shared", storage=_storage(url)).get_trials()
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both processes measured trials


def _storage(url: str):
    if "://" in url:
        return url
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(url))


def test_pareto_front_of_speedup_and_memory_while_sampling(tiny_model_dir, tmp_path):
    """Multi-objective, at temperature > 0: no pruning, a front, a greedy losslessness check per trial."""
    result = invoke("tune", "--model", tiny_model_dir, "--strategy", "ngram", "--objectives", "speedup,memory",
                    "--temperature", 0.8, "--trials", 3, "--limit", 3, "--max-new-tokens", 6, "--out", tmp_path,
                    "--study", "front", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["objectives"] == ["speedup", "memory"] and record["pareto"]
    assert record["best_value"] == max(p["speedup"] for p in record["pareto"])
    assert all(p["memory_bytes"] > 0 for p in record["pareto"])
    assert {Path(p).stem for p in record["plots"]} >= {"pareto"}
    assert tomllib.loads(Path(record["toml"]).read_text())["temperature"] == 0.8
    assert all(not t.intermediate_values for t in trials_of(tmp_path, "front"))


def test_recommend_reads_the_tuned_study(projected):
    from specbench.recommender import make_workload, recommend

    out, record = projected
    rec = recommend(make_workload("rtx4090"), out)
    assert (rec.strategy, rec.source, rec.rests_on) == ("dspark", "projected", (str(out / "tuned" / f"{STUDY}.json"),))
    assert rec.speedup == record["holdout"]["tuned"]["speedup"]
    assert rec.config.command() == f"specbench run --config {out / 'tuned' / f'{STUDY}.toml'}"
    assert rec.config.knobs == {"dspark": {k: v for k, v in record["best_params"].items() if k != "controller"}}


def test_recommend_after_an_interrupted_tune_names_what_it_did_not_measure(tiny_model_dir, tiny_draft_dir, tmp_path):
    """The case of issue 20: `tune --gpu rtx4090` of two strategies, interrupted in the second one's study,
    its first study stopped short of its trials (--timeout) with 2 held-out prompts. The answer is the one
    strategy measured, but it says which candidates the evidence cannot rank and how to measure them."""
    from specbench.plan.run_config import RunConfig
    from specbench.recommender import make_workload, recommend
    from specbench.tuning.study_config import TuneConfig
    from specbench.tuning.study_runner import tune as run_tune

    def interrupt_the_second_study(name: str, done: int, total: int, best, trial) -> None:
        if name.startswith("draft-"):
            raise KeyboardInterrupt

    workload = RunConfig(model=str(tiny_model_dir), drafters=[str(tiny_draft_dir)], limit=8, max_new_tokens=6,
                         gpu="rtx4090", out=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        run_tune(TuneConfig(workload, ("ngram", "draft"), trials=6, timeout=0.01), interrupt_the_second_study)
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "tuned").glob("*.json")]
    assert record["strategy"] == "ngram" and record["projected"] and record["prompts"]["holdout"] == 2

    rec = recommend(make_workload("rtx4090", "code"), tmp_path)
    assert (rec.strategy, rec.source, rec.prior.strategy) == ("ngram", "projected", "dspark")
    assert [u.strategy for u in rec.unmeasured] == ["dspark", "draft"]
    assert "the prior's choice; no evidence" in rec.unmeasured[0].expected
    assert "planned by the interrupted tune" in rec.unmeasured[1].expected
    assert rec.measure == "specbench tune --strategy dspark,draft --gpu rtx4090 --category code"
    assert rec.incomplete[0] == f"study short of its trials: {record['trials']['counted']} of 3"
    assert "was also asked for draft and stopped first" in rec.incomplete[1]
    result = invoke("recommend", "--gpu", "rtx4090", "--task", "code", "--results", tmp_path, "--explain")
    assert result.exit_code == 0, result.output
    assert "recommend: ngram (projected)" in result.stdout and "over 2 prompts" in result.stdout
    assert "incomplete evidence: study short of its trials" in result.stdout
    assert "unmeasured: the evidence cannot rank dspark, draft against ngram" in result.stdout
    assert "measure them: specbench tune --strategy dspark,draft --gpu rtx4090 --category code" in result.stdout
    assert "| dspark | unmeasured | no figure |" in result.stdout and "unmeasured candidates" in result.stdout
    answer = json.loads(invoke("recommend", "--gpu", "rtx4090", "--task", "code", "--results", tmp_path,
                               "--json").stdout)
    assert [u["strategy"] for u in answer["unmeasured"]["candidates"]] == ["dspark", "draft"]
    assert answer["unmeasured"]["command"] == rec.measure and answer["incomplete"] == rec.incomplete
    assert answer["evidence"]["candidates"][0]["incomplete"] == rec.incomplete[0]
