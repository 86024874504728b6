"""`specbench recommend`: the prior's rules, evidence over the prior, the learned tree, the CLI."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from specbench.analysis.hardware import load_profiles
from specbench.cli import app
from specbench.core.errors import SpecbenchError
from specbench.methods.knobs import make_options, validate_knobs
from specbench.methods.registry import DRAFTER_NAMES, definition
from specbench.recommender import PRIOR, evaluate, learn, make_workload, prior_markdown, recommend
from specbench.recommender.evidence import load_evidence
from specbench.recommender.prior import members, short_draft_knobs
from tests.helpers import write_run, write_study

runner = CliRunner()
A100 = "NVIDIA A100-SXM4-80GB"  # NVML's name: the a100-80g profile, PCIe 4


def invoke(*args):
    return runner.invoke(app, ["recommend", *[str(a) for a in args]])


# -- the prior -------------------------------------------------------------------------------

# (workload, rule, branch index, the prior's answer)
BRANCHES = [
    (dict(gpu="a100-80g"), "load", 0, "dspark"),
    (dict(gpu="a100-80g", batch_size=100), "load", 1, "ar"),
    (dict(gpu="a100-80g", batch_size=32), "load", 2, "dspark"),
    (dict(gpu="a100-80g", batch_size=2), "load", 3, "dspark"),
    (dict(gpu="rtx4090", vram_used_gb=20), "memory", 0, "dflash"),
    (dict(gpu="rtx4090", vram_used_gb=8), "memory", 1, "dspark"),
    (dict(gpu="a100-80g", task="legal"), "error_tolerance", 0, "mtp"),
    (dict(gpu="a100-80g", task="chat"), "error_tolerance", 1, "eagle"),
    (dict(gpu="a100-80g", task="math"), "error_tolerance", 2, "dspark"),
    (dict(gpu="a100-80g", bw_util=0.8), "bandwidth", 0, "dflash"),
    (dict(gpu="a100-80g", bw_util=0.5), "bandwidth", 1, "eagle"),
    (dict(gpu="a100-80g", bw_util=0.7), "bandwidth", 2, "dspark"),
    (dict(gpu="a100-80g", score_variance=0.01), "score_variance", 0, "eagle"),
    (dict(gpu="a100-80g", score_variance=0.3), "score_variance", 1, "mtp"),
    (dict(gpu="a100-80g", score_variance=0.1), "score_variance", 2, "dspark"),
    (dict(gpu="a100-80g", cuda_experience="none"), "team", 0, "dspark"),
    (dict(gpu="a100-80g", cuda_experience="expert"), "team", 1, "dflash"),
    (dict(gpu="a100-80g", cuda_experience="some"), "team", 2, "dspark"),
    (dict(gpu="a100-80g"), "fallback", 0, "dspark"),
    (dict(gpu="rtx5090", task="chat"), "pcie", 0, "eagle+dspark"),
    (dict(gpu="a100-80g", task="chat"), "pcie", 1, "eagle"),
]


def test_the_table_reaches_every_branch_of_every_rule():
    reached = {(rule, index) for _, rule, index, _ in BRANCHES}
    assert reached == {(r.id, i) for r in PRIOR for i in range(len(r.branches))}


@pytest.mark.parametrize(("inputs", "rule", "index", "answer"), BRANCHES)
def test_prior_rule(inputs, rule, index, answer):
    outcome = evaluate(make_workload(**inputs))
    assert outcome.branches[rule] is next(r for r in PRIOR if r.id == rule).branches[index]
    assert outcome.strategy == answer
    assert len(outcome.alternatives) == 2 and answer not in {a.strategy for a in outcome.alternatives}


@pytest.mark.parametrize(("args", "expected"), [
    (["--gpu", "rtx4090", "--vram-used", 20, "--task", "chat"], "dflash"),
    (["--gpu", "a100-80g", "--vram-used", 8, "--task", "legal"], "mtp"),
    (["--gpu", "a100-80g", "--vram-used", 8, "--task", "creative", "--pcie", 4], "eagle"),
    (["--gpu", "rtx5090", "--vram-used", 8, "--task", "creative", "--pcie", 5], "eagle+dspark"),
    (["--gpu", "a100-80g", "--vram-used", 8, "--task", "code", "--cuda-experience", "none"], "dspark"),
])
def test_the_five_cases_with_no_results(tmp_path, args, expected):
    result = invoke(*args, "--results", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert (answer["strategy"], answer["source"], answer["evidence"]["rests_on"]) == (expected, "prior", [])


@pytest.mark.parametrize(("task", "expected"), [("roleplay", "eagle"), ("writing", "eagle"), ("coding", "dspark")])
def test_speed_bench_categories_are_tasks(tmp_path, task, expected):
    """SPEED-Bench's roleplay and writing are creative work to the prior's error-tolerance rule; its other
    categories are tasks the rule says nothing about."""
    result = invoke("--gpu", "a100-80g", "--vram-used", 8, "--task", task, "--pcie", 4, "--results", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["strategy"] == expected


def test_the_prior_never_pairs_eagle_with_mtp_on_pcie_4_or_older():
    signals = itertools.product(("chat", "legal", "code"), (None, 8, 20), (None, 0.5, 0.8), (None, 0.01, 0.3),
                                (None, "none", "expert"), (1, 32), (3, 4))
    for task, vram, bw, variance, team, batch, pcie in signals:
        outcome = evaluate(make_workload("a100-80g", task, batch, vram_used_gb=vram, pcie=pcie, bw_util=bw,
                                         score_variance=variance, cuda_experience=team))
        assert not {"eagle", "mtp"} <= members(outcome.strategy)
        assert frozenset({"eagle", "mtp"}) in outcome.avoid


def test_under_load_the_prior_shortens_the_draft_to_what_a_forward_verifies():
    outcome = evaluate(make_workload("rtx5090", "chat", batch_size=32))  # ridge 117 tokens: 3 per sequence
    assert outcome.strategy == "eagle" and outcome.knobs == {"eagle": {"depth": 2, "total_tokens": 2}}
    assert "not combined under load" in outcome.path[-1].outcome


@pytest.mark.parametrize("strategy", [*DRAFTER_NAMES, "eagle+dspark"])
def test_short_draft_knobs_are_valid_run_knobs(strategy):
    for drafts in range(1, 8):
        knobs = short_draft_knobs(strategy, drafts)
        validate_knobs(knobs)
        assert set(knobs) == set(members(strategy))
        # each member drafts at most `drafts` tokens a step, and drafts at all
        assert all(1 <= definition(m).budget(make_options(m, values)) <= drafts for m, values in knobs.items())


def test_the_prior_prints_every_rule():
    text = prior_markdown()
    assert all(f"**{rule.id}**" in text for rule in PRIOR)
    assert text.count("   - `") == sum(len(rule.branches) for rule in PRIOR)


# -- evidence --------------------------------------------------------------------------------


def test_measured_evidence_outranks_the_prior(tmp_path):
    run = write_run(tmp_path, "a", {"ngram": {"code": 1.3, "chat": 2.4}, "eagle": 1.5, "dspark": 1.8})
    rec = recommend(make_workload("cpu", "chat"), tmp_path)
    assert (rec.strategy, rec.source, rec.rests_on) == ("ngram", "measured", (str(run),))
    assert rec.prior.strategy == "eagle" and not rec.prior_agrees
    assert rec.ci[0] < rec.speedup < rec.ci[1] and 2.2 < rec.speedup < 2.6
    assert [a.strategy for a in rec.alternatives] == ["dspark", "eagle"]
    assert "below ngram's" in rec.alternatives[0].reason


def test_runs_of_one_configuration_pool_their_prompts(tmp_path):
    a = write_run(tmp_path, "a", {"dspark": 2.0}, seed=1)
    b = write_run(tmp_path, "b", {"dspark": 2.0}, seed=2)
    write_run(tmp_path, "c", {"dspark": 3.0}, knobs={"dspark": {"block_size": 4}}, seed=3)
    rec = recommend(make_workload("cpu"), tmp_path)
    assert rec.config.knobs == {"dspark": {"block_size": 4}} and "--set dspark.block_size=4" in rec.config.command()
    assert rec.rests_on == (str(tmp_path / "runs" / "c"),)
    ar = next(a.candidate for a in rec.ranking if a.candidate.strategy == "ar")
    assert ar.rests_on == tuple(sorted(map(str, (a, b, tmp_path / "runs" / "c")))) and ar.prompts == 36


def test_the_source_follows_the_evidence(tmp_path):
    projection = {s: {"projected": True, "gpu": "rtx4090", "verify_s": 1e-3, "verify_bound": "memory", "draft_s": 0.0,
                      "overhead_s": 2e-5, "step_s": 1e-3, "tau": v, "tokens_per_s": 1e3 * v, "ar_tokens_per_s": 1e3,
                      "speedup": v, "memory_fit": {"projected": True, "fits": True, "need_gb": 1.0, "have_gb": 24.0}}
                  for s, v in {"ar": 1.0, "eagle": 2.6, "dspark": 2.1}.items()}
    write_run(tmp_path, "cpu-run", {"eagle": 1.2, "dspark": 1.5}, projections=projection)
    rec = recommend(make_workload("rtx4090"), tmp_path)
    assert (rec.strategy, rec.source, rec.ci) == ("eagle", "projected", None)

    write_run(tmp_path, "gpu-run", {"dflash": 1.7}, cuda="NVIDIA GeForce RTX 4090")
    rec = recommend(make_workload("rtx4090"), tmp_path)
    assert (rec.strategy, rec.source) == ("dflash", "measured")  # measured ranks before a higher projection
    assert rec.alternatives[0].strategy == "eagle" and "measured evidence ranks first" in rec.alternatives[0].reason
    # but the measurement covers dflash alone: what the projection and the prior rank higher is unmeasured
    assert [(u.strategy, u.expected) for u in rec.unmeasured] == [
        ("eagle", "projected 2.60x, above dflash's 1.70x, but no measured evidence"),
        ("dspark", "projected 2.10x, above dflash's 1.70x, but no measured evidence")]
    assert rec.measure == "specbench run --strategy dflash,eagle,dspark --gpu rtx4090" and not rec.incomplete

    rec = recommend(make_workload("rtx4090", temperature=0.7), tmp_path)
    assert rec.source == "prior" and all("temperature 0, not 0.7" in note for note in rec.unmatched)


def test_evidence_matches_the_batch_size(tmp_path):
    write_run(tmp_path, "b1", {"dspark": 2.0})
    b16 = write_run(tmp_path, "b16", {"dspark": 0.8, "ngram": 1.1}, batch_size=16)
    assert recommend(make_workload("cpu"), tmp_path).strategy == "dspark"
    rec = recommend(make_workload("cpu", batch_size=16), tmp_path)
    assert (rec.strategy, rec.rests_on) == ("ngram", (str(b16),))
    rec = recommend(make_workload("cpu", batch_size=8), tmp_path)  # cpu: compute-bound from 5 tokens a forward
    assert (rec.strategy, rec.source) == ("ar", "prior") and any("batch size 1, not 8" in n for n in rec.unmatched)


def test_a_load_axis_offers_modelled_evidence_at_other_batch_sizes(tmp_path):
    run = write_run(tmp_path, "b1", {"dspark": 2.0, "ngram": 1.2}, categories=("code",),
                    modelled={8: {"dspark": 1.3, "ngram": 1.05}, 16: {"dspark": 0.9, "ngram": 0.97}})
    rec = recommend(make_workload("cpu", batch_size=8), tmp_path)
    assert (rec.strategy, rec.source, rec.rests_on) == ("dspark", "modelled", (str(run),))
    assert rec.speedup == pytest.approx(1.3) and rec.ci is None
    assert recommend(make_workload("cpu", batch_size=16), tmp_path).strategy == "ar"  # nothing pays at 16
    assert recommend(make_workload("cpu", batch_size=8, task="code"), tmp_path).source == "modelled"

    write_run(tmp_path, "b8", {"ngram": 1.1}, categories=("code",), batch_size=8)
    rec = recommend(make_workload("cpu", batch_size=8), tmp_path)
    assert (rec.strategy, rec.source) == ("ngram", "measured")  # measured at 8 ranks before modelled at 8


def test_a_tuned_study_brings_its_configuration_and_held_out_speedup(tmp_path, monkeypatch):
    monkeypatch.setattr("specbench.recommender.workload.detect_local_gpu", lambda: None)
    write_run(tmp_path, "a", {"dspark": 1.8, "dflash": 1.6})
    toml = write_study(tmp_path, "dspark-cpu", "dspark", 2.2)
    rec = recommend(make_workload(), tmp_path)  # detected, not named: a study tuned without --gpu speaks for it
    assert (rec.strategy, rec.source, rec.speedup) == ("dspark", "measured", 2.2)
    assert rec.ci == pytest.approx((2.1, 2.3))
    assert rec.config.toml == str(toml) and rec.config.command() == f"specbench run --config {toml}"
    assert rec.config.knobs == {"dspark": {"block_size": 5}}

    write_study(tmp_path, "dflash-h200", "dflash", 3.0, gpu="h200", projected=True)
    rec = recommend(make_workload("h200"), tmp_path)
    assert (rec.strategy, rec.source) == ("dflash", "projected")

    write_study(tmp_path, "eagle-h200", "eagle", 4.0, gpu="h200", projected=True, best_params=None, toml=None,
           note="no configuration fits h200's memory")
    rec = recommend(make_workload("h200"), tmp_path)
    assert rec.strategy == "dflash" and any("eagle-h200.json: no configuration fits" in n for n in rec.unmatched)


def test_what_does_not_fit_or_breaks_a_rule_is_not_recommended(tmp_path):
    write_run(tmp_path, "a100", {"eagle+mtp": 3.0, "dflash": 2.0, "dspark": 1.5}, cuda=A100,
              drafter_bytes={"dflash": 30_000_000_000})
    rec = recommend(make_workload("a100-80g", vram_used_gb=60), tmp_path)
    assert rec.strategy == "dspark"
    reasons = {a.strategy: a.reason for a in rec.alternatives}
    assert "excluded by the prior: PCIe 4.0: avoid EAGLE+MTP" in reasons["eagle+mtp"]
    assert "does not fit: needs 90.0 GB of 80 GB" in reasons["dflash"]
    assert recommend(make_workload("a100-80g"), tmp_path).strategy == "dflash"  # 30 GB alone fits
    assert recommend(make_workload("a100-80g", pcie=5), tmp_path).strategy == "eagle+mtp"


def test_memory_follows_the_context_length(tmp_path):
    write_run(tmp_path, "a", {"dspark": 2.0})  # 80 MB of weights + 50 kB of KV per token
    ranking = recommend(make_workload("cpu", context_len=100_000), tmp_path).ranking
    need = {a.candidate.strategy: a.need_bytes for a in ranking}
    assert need["ar"] == pytest.approx(80e6 + 50e3 * 100_001)
    with pytest.raises(SpecbenchError, match=r"nothing fits on cpu: even plain decoding does not fit: needs 10\.1 GB"):
        recommend(make_workload("cpu", context_len=200_000), tmp_path)


def test_a_strategy_that_broke_losslessness_is_left_out(tmp_path):
    write_run(tmp_path, "a", {"dflash": 2.5, "dspark": 1.8}, mismatched=("dflash",))
    rec = recommend(make_workload("cpu"), tmp_path)
    assert rec.strategy == "dspark" and any("dflash left out" in note for note in rec.unmatched)


def test_unreadable_runs_are_skipped_and_named(tmp_path):
    write_run(tmp_path, "good", {"ngram": 1.7})
    (tmp_path / "runs" / "empty").mkdir()
    (tmp_path / "runs" / "torn").mkdir()
    (tmp_path / "runs" / "torn" / "run.json").write_text("{")
    result = invoke("--gpu", "cpu", "--results", tmp_path)
    assert result.exit_code == 0, result.output
    assert "recommend: ngram (measured)" in result.stdout
    assert "runs/empty" in result.output and "runs/torn" in result.output and "skipped" in result.output


def test_unreadable_studies_are_skipped_and_named(tmp_path):
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "list.json").write_text("[]")
    (tuned / "bare.json").write_text('{"study": "bare", "strategy": "ngram"}')
    skipped = load_evidence(tmp_path).skipped
    assert any("list.json must hold a JSON object" in s for s in skipped)
    assert any(s.startswith(f"the entries of tuned study {tuned / 'bare.json'} lack key(s): storage, model")
               for s in skipped)


@pytest.mark.parametrize("bug", [KeyError("speedup"), TypeError("'NoneType' object is not subscriptable")])
def test_a_bug_in_the_reading_surfaces(tmp_path, monkeypatch, bug):
    """Only a damaged file is skipped: an error of the reading code itself would silently drop evidence."""
    write_run(tmp_path, "good", {"ngram": 1.7})

    def broken(path):
        raise bug

    monkeypatch.setattr("specbench.recommender.evidence._run_record", broken)
    with pytest.raises(type(bug)):
        load_evidence(tmp_path)


# -- the learned tree ------------------------------------------------------------------------


def test_the_learned_tree_recovers_a_planted_rule(tmp_path):
    planted = {"ngram": {"code": 2.5, "chat": 1.2}, "dspark": {"code": 1.5, "chat": 1.9}}
    write_run(tmp_path, "cpu", planted, prompts=12)
    write_run(tmp_path, "h200", planted, prompts=12, cuda="NVIDIA H200", seed=1)
    report = learn(load_evidence(tmp_path), load_profiles(), tmp_path / "decision_tree")
    assert report.fitted and report.examples == 48 and report.cv_accuracy == 1.0
    assert {(leaf.conditions, leaf.learned, leaf.purity) for leaf in report.leaves} == {
        ("category != code", "dspark", 1.0), ("category = code", "ngram", 1.0)}
    chat = next(n for n in report.nodes if n.branch.startswith("task in creative, chat") and "eagle" in n.branch)
    assert (chat.reached, chat.claims, chat.measured_agree, chat.verdict) == (24, 24, 0, "disagrees")
    assert {p.name for p in report.files} == {"learned.txt", "learned.md", "learned.png", "prior.md"}
    assert all(p.stat().st_size > 0 for p in report.files)
    assert "category = code" in (tmp_path / "decision_tree" / "learned.md").read_text()


@pytest.mark.parametrize(("runs", "reason"), [
    ([dict(speedups={"ngram": 2.0}, prompts=3)], "6 measured prompts, at least 30 needed"),
    ([dict(speedups={"ngram": 2.0}, prompts=20)], "ngram is fastest on all 40 prompts"),
    ([dict(speedups={"ngram": 1.5, "dspark": 1.5}, prompts=30, noise=0.05)], "not significantly above"),
])
def test_too_little_evidence_is_said_not_fitted(tmp_path, runs, reason):
    for i, kwargs in enumerate(runs):
        write_run(tmp_path, f"r{i}", **kwargs)
    report = learn(load_evidence(tmp_path), load_profiles(), tmp_path / "decision_tree")
    assert not report.fitted and reason in report.reason
    assert not (tmp_path / "decision_tree" / "learned.png").exists()
    assert "Not fitted" in (tmp_path / "decision_tree" / "learned.md").read_text()


# -- the command -----------------------------------------------------------------------------


def test_json_shape(tmp_path):
    write_run(tmp_path, "a", {"ngram": 1.4, "dspark": 1.9, "eagle": 1.2}, prompts=15)
    result = invoke("--gpu", "cpu", "--task", "code", "--results", tmp_path, "--learn", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert {"strategy", "source", "config", "expected_speedup", "alternatives", "path", "evidence"} <= set(answer)
    assert answer["strategy"] == "dspark" and answer["source"] == "measured"
    assert set(answer["expected_speedup"]) == {"value", "ci"} and len(answer["expected_speedup"]["ci"]) == 2
    assert answer["config"]["command"] == "specbench run --strategy dspark"
    assert [a["strategy"] for a in answer["alternatives"]] == ["ngram", "eagle"]
    assert all(set(a) == {"strategy", "engine", "source", "expected_speedup", "reason"} for a in answer["alternatives"])
    assert answer["engine"] == "specbench" and {a["engine"] for a in answer["alternatives"]} == {"specbench"}
    assert all(set(step) == {"node", "question", "answer", "outcome"} for step in answer["path"])
    assert answer["evidence"]["rests_on"] == [str(tmp_path / "runs" / "a")]
    assert answer["prior"]["strategy"] == "dspark"
    assert not answer["learned"]["fitted"] and "dspark is fastest on all 30 prompts" in answer["learned"]["reason"]


def test_explain_prints_the_path_as_plain_text_when_piped(tmp_path):
    result = invoke("--gpu", "rtx5090", "--task", "creative", "--vram-used", 8, "--results", tmp_path, "--explain")
    assert result.exit_code == 0, result.output
    assert "recommend: eagle+dspark (prior)" in result.stdout
    assert "| eagle | prior | no figure |" in result.stdout
    assert "\n  path\n    evidence: " in result.stdout and "    pcie: " in result.stdout
    assert "─" not in result.stdout  # no box drawing when piped


def test_a_vllm_deployment_ranks_vllm_figures_first_and_names_each_figures_engine(tmp_path):
    write_run(tmp_path, "own", {"ngram": 1.6, "dspark": 2.2}, prompts=8)
    served = write_run(tmp_path, "served", {"ngram": 1.25}, prompts=8, seed=1)
    rows = [json.loads(line) for line in (served / "rows.jsonl").read_text().splitlines()]
    (served / "rows.jsonl").write_text("".join(json.dumps({**r, "engine": "vllm"}) + "\n" for r in rows))
    vllm = json.loads(invoke("--gpu", "cpu", "--task", "code", "--results", tmp_path, "--engine", "vllm",
                             "--json").stdout)
    assert (vllm["strategy"], vllm["engine"], vllm["source"]) == ("ngram", "vllm", "measured")
    assert vllm["config"]["command"] == "specbench run --strategy ngram --engine vllm"
    assert vllm["expected_speedup"]["value"] == pytest.approx(1.25, rel=0.05)
    dspark = next(a for a in vllm["alternatives"] if a["strategy"] == "dspark")
    assert dspark["engine"] == "specbench" and "the deployment's engine (vllm) ranks first" in dspark["reason"]
    anywhere = json.loads(invoke("--gpu", "cpu", "--task", "code", "--results", tmp_path, "--json").stdout)
    assert (anywhere["strategy"], anywhere["engine"]) == ("dspark", "specbench")
    assert invoke("--gpu", "cpu", "--engine", "sglang", "--results", tmp_path).exit_code == 2
