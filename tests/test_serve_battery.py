"""`specbench serve` against every fault an endpoint can give, in seconds: a small OpenAI-compatible server
(tests/openai_server.py) behind the fault-injecting proxy (tests/fault_proxy.py). Each fault either fails
requests and leaves the level incomplete, measured again by --resume and by nothing else, or stops the run
in one line; a run that ends incomplete exits 3 and names its levels; no credential reaches a host it was
not given to. tests/test_serve_faults.py runs the same proxy in front of a real `vllm serve`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from tests.fault_proxy import FaultProxy
from tests.openai_server import OpenAIServer

runner = CliRunner()
KEY = "sk-battery-secret"
INCOMPLETE = 3


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def server(tokenizer, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIServer(tokenizer, key=KEY) as server:
        yield server


@pytest.fixture
def proxy(server):
    with FaultProxy(server.url) as proxy:
        yield proxy


def serve(url: str, out: Path, tokenizer_dir, *extra: str, key: str | None = KEY, levels: str = "1"):
    return runner.invoke(app, ["serve", "--endpoint", f"ar={url}", "--tokenizer", str(tokenizer_dir),
                               "--concurrency", levels, "--requests", "4", "--warmup", "1", "--output-len", "8",
                               "--json", "--out", str(out), *extra, *(["--api-key", key] if key else [])])


def resume(run_dir: str, key: str | None = KEY):
    return runner.invoke(app, ["serve", "--resume", run_dir, "--json", *(["--api-key", key] if key else [])])


def report_of(result) -> dict:
    return json.loads(result.stdout)


def level(report: dict, key: str) -> dict:
    return next(e for e in report["levels"] if e["level"] == key)


def run_dir_of(out: Path) -> Path:
    return next(out.glob("serve/*"))


def secrets_in(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file() and KEY in p.read_text(errors="replace")]


def test_a_clean_run_is_complete_and_its_counters_are_the_levels_own(proxy, tiny_model_dir, tmp_path):
    """Two levels, each its own prompts (an endpoint's prefix cache is its own); the counters are the measured
    requests' alone (the server counts 2 drafts a completion: 4 requests, 8 drafts, warm-up left out)."""
    result = serve(proxy.url, tmp_path, tiny_model_dir, levels="1,2")
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["complete"] and report["incomplete"] == []
    assert any("each level sends prompts no earlier level sent" in note for note in report["notes"])
    for key in ("c1", "c2"):
        assert level(report, key)["errors"] == 0 and level(report, key)["speculation"]["drafts"] == 8
    run_dir = Path(report["run_dir"])
    prompts = [{r["prompt_id"] for r in json.loads((run_dir / f"levels/ar/{key}.json").read_text())["records"]}
               for key in ("c1", "c2")]
    assert len(prompts[0]) == len(prompts[1]) == 4 and not prompts[0] & prompts[1]
    assert not secrets_in(run_dir)


@pytest.mark.parametrize("fault, first", [("429", "HTTP 429: injected HTTP 429"),
                                          ("500", "HTTP 500: injected HTTP 500"),
                                          ("stream_error", "error in the stream: injected failure"),
                                          ("malformed_sse", "JSONDecodeError")])
def test_a_failed_request_leaves_its_level_incomplete_and_resume_measures_it_alone(proxy, tiny_model_dir, tmp_path,
                                                                                   fault, first):
    """c1 passes (its warm-up and 4 requests), c2's last two requests fail: the run exits 3 naming c2, and
    --resume measures c2 again and not c1."""
    proxy.set(fault, after=1 + 4 + 1 + 2)
    result = serve(proxy.url, tmp_path, tiny_model_dir, levels="1,2")
    assert result.exit_code == INCOMPLETE, result.output
    report = report_of(result)
    assert not report["complete"] and report["incomplete"] == ["ar c2"]
    assert level(report, "c1")["errors"] == 0 and level(report, "c2")["errors"] == 2
    assert any(f"2 of 4 requests at concurrency 2 failed (first: {first}" in note for note in report["notes"]), \
        report["notes"]
    assert "incomplete: ar c2; resume it with: specbench serve --resume" in result.output
    run_dir = run_dir_of(tmp_path)
    kept = (run_dir / "levels/ar/c1.json").stat().st_mtime_ns
    proxy.set(None)
    resumed = resume(str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    report = report_of(resumed)
    assert report["complete"] and level(report, "c2")["errors"] == 0 and level(report, "c2")["requests"] == 4
    assert (run_dir / "levels/ar/c1.json").stat().st_mtime_ns == kept  # not measured twice


@pytest.mark.parametrize("status", ["401", "403"])
def test_a_refusal_mid_level_stops_the_run_in_one_line(proxy, tiny_model_dir, tmp_path, status):
    proxy.set(status, after=3)
    result = serve(proxy.url, tmp_path, tiny_model_dir)
    assert result.exit_code == INCOMPLETE, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"refused specbench's credentials (HTTP {status}) during concurrency 1" in lines[0]
    assert "the run stopped; resume it with: specbench serve --resume" in lines[0]
    run_dir = run_dir_of(tmp_path)
    written = json.loads((run_dir / "levels/ar/c1.json").read_text())
    assert not written["complete"] and sum(bool(r["error"]) for r in written["records"]) == 2
    assert json.loads((run_dir / "serve.json").read_text())["status"] == "incomplete"
    proxy.set(None)
    resumed = resume(str(run_dir))
    assert resumed.exit_code == 0 and report_of(resumed)["complete"], resumed.output


@pytest.mark.parametrize("status, message", [("401", "refused specbench's credentials (HTTP 401 at /tokenize)"),
                                             ("403", "refused specbench's credentials (HTTP 403 at /tokenize)"),
                                             ("500", "answered HTTP 500 at /tokenize; the server failed")])
def test_a_failure_at_tokenize_is_one_line_never_a_skipped_check(proxy, tiny_model_dir, tmp_path, status, message):
    proxy.set(status, path="/tokenize")
    result = serve(proxy.url, tmp_path, tiny_model_dir)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "serve").exists()


@pytest.mark.parametrize("after, when", [(0, "before"), (1, "after")])
def test_metrics_failing_around_a_level_leaves_it_without_counters_and_says_so(proxy, tiny_model_dir, tmp_path,
                                                                               after, when):
    proxy.set("500", path="/metrics", after=after, times=1)
    result = serve(proxy.url, tmp_path, tiny_model_dir)
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["complete"] and level(report, "c1")["speculation"] is None
    why = f"its /metrics failed {when} the level (HTTP 500)"
    assert f"ar: concurrency 1 has no speculative counters: {why}" in report["notes"], report["notes"]
    assert json.loads((run_dir_of(tmp_path) / "levels/ar/c1.json").read_text())["counters_missing"] == why


def sweep_until(proxy: FaultProxy, tiny_model_dir, tmp_path, fault: str, path: str):
    """A two-level sweep on the library, the fault set as the second level begins."""
    from specbench.serving.serve_config import serve_config
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import plan, serve_sweep, strategy_names

    config = serve_config({"out": str(tmp_path)}, KEY, concurrency=[1, 2], requests=4, warmup=1, output_len=8,
                          endpoints={"ar": proxy.url}, tokenizer=str(tiny_model_dir))
    run = ServeRun.create(config, strategy_names(config), "the tiny model", config.run.suite)

    def at_the_second_level(name, lv, done, total) -> None:
        if lv.concurrency == 2 and done == 0:
            proxy.set(fault, path=path)

    return run, lambda: serve_sweep(run, plan(config), at_the_second_level)


def test_a_5xx_from_models_at_a_levels_start_leaves_it_unmeasured(proxy, tiny_model_dir, tmp_path):
    run, sweep = sweep_until(proxy, tiny_model_dir, tmp_path, "503", "/v1/models")
    result = sweep()
    assert not result.complete and result.incomplete == ["ar c2"]
    assert any("named no model at /v1/models before concurrency 2 (HTTP 503" in note and "not measured" in note
               for note in result.notes), result.notes
    assert not (run.path / "levels/ar/c2.json").exists()
    proxy.set(None)
    resumed = resume(str(run.path))
    assert resumed.exit_code == 0 and report_of(resumed)["complete"], resumed.output


def test_a_401_from_models_at_a_levels_start_stops_the_run(proxy, tiny_model_dir, tmp_path):
    """As a server specbench started refuses it where VLLM_API_KEY reached it."""
    from specbench.core.errors import Stopped

    run, sweep = sweep_until(proxy, tiny_model_dir, tmp_path, "401", "/v1/models")
    with pytest.raises(Stopped, match=r"refused specbench's credentials \(HTTP 401 at /v1/models\) before "
                                      "concurrency 2"):
        sweep()
    assert json.loads((run.path / "summary.json").read_text())["incomplete"] == ["ar c2"]


@pytest.fixture
def elsewhere(tokenizer):
    """Another host on this machine, where a redirect points: whatever reaches it is recorded."""
    with OpenAIServer(tokenizer, host="127.0.0.2") as other:
        yield other


def test_no_credential_follows_a_redirect_to_another_host(proxy, elsewhere, tiny_model_dir, tmp_path):
    proxy.redirect_to = elsewhere.url
    proxy.set("redirect", path="/v1/models")
    result = serve(proxy.url, tmp_path, tiny_model_dir, "--header", "X-Team:bench")
    assert result.exit_code == 2, result.output
    assert f"redirects (HTTP 302 at /v1/models) to {elsewhere.url}/v1/models: specbench follows no redirect" in \
        result.output
    assert elsewhere.seen == []  # followed, the key would have arrived with it
    proxy.set("redirect", after=2)  # mid-level: the completions' redirects are failures, not followed
    result = serve(proxy.url, tmp_path, tiny_model_dir)
    assert result.exit_code == INCOMPLETE, result.output
    assert any(f"HTTP 302: a redirect to {elsewhere.url}/v1/completions, not followed" in note
               for note in report_of(result)["notes"])
    assert elsewhere.seen == []
    assert KEY not in result.output


def test_the_environments_key_goes_only_to_https_or_this_machine(proxy, tiny_model_dir, tmp_path, monkeypatch):
    from specbench.serving.endpoint import chosen_key

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = serve(proxy.url, tmp_path, tiny_model_dir, key=None)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("sending OPENAI_API_KEY from the environment to ar (https or this machine)")
    key, line = chosen_key({"ar": proxy.url, "remote": "http://10.0.0.5:8000"}, None)
    assert key is None and line.startswith("OPENAI_API_KEY is not sent: remote=http://10.0.0.5:8000 is plain http")
    assert chosen_key({"remote": "https://10.0.0.5"}, None)[0] == KEY
    assert chosen_key({"remote": "http://10.0.0.5:8000"}, "given") == ("given", None)


def test_a_started_server_gets_no_inherited_key_and_a_given_one_by_environment(monkeypatch):
    from specbench.serving.server import key_by_environment, serve_command

    env = {"VLLM_API_KEY": "inherited", "PATH": "/bin"}
    assert key_by_environment({"model": "m"}, env) == {"model": "m"} and "VLLM_API_KEY" not in env
    arguments = key_by_environment({"model": "m", "api_key": KEY}, env)
    assert env["VLLM_API_KEY"] == KEY and KEY not in serve_command(arguments, 8000)


def test_a_strict_openai_compatible_server_gets_the_standard_fields_alone(tokenizer, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    """No /tokenize: the tokenizer is checked by the prompt tokens a completion counts; no vLLM field is sent."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIServer(tokenizer, strict=True, tokenize=False) as strict:
        result = serve(strict.url, tmp_path, tiny_model_dir, key=None)
    assert result.exit_code == 0, result.output
    report = report_of(result)
    assert report["complete"] and level(report, "c1")["errors"] == 0
    assert any("ar: not vLLM" in note for note in report["notes"]) and not any("tokenize" in n for n in report["notes"])
    bodies = [body for path, _, body in strict.seen if path == "/v1/completions" and body.get("stream")]
    assert len(bodies) == 5 and not any({"return_token_ids", "ignore_eos"} & set(body) for body in bodies)


def test_sharegpt_prompts_are_the_conversations_first_turns(proxy, tiny_model_dir, tmp_path):
    result = serve(proxy.url, tmp_path, tiny_model_dir, "--dataset", "sharegpt")
    assert result.exit_code == 0, result.output
    records = json.loads((run_dir_of(tmp_path) / "levels/ar/c1.json").read_text())["records"]
    assert len(records) == 4 and all(r["prompt_id"].endswith("/1") for r in records)
    assert json.loads((run_dir_of(tmp_path) / "serve.json").read_text())["config"]["dataset"] == "sharegpt"


def test_multi_turn_replays_each_turn_with_the_conversation_before_it(proxy, server, tiny_model_dir, tmp_path):
    conversations = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"the quick brown fox {i}"}, {"from": "gpt", "value": f"def f{i}(x): return x"},
        {"from": "human", "value": f"return x + {i} again"}, {"from": "gpt", "value": "done"}]} for i in range(4)]
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(conversations))
    result = serve(proxy.url, tmp_path / "out", tiny_model_dir, "--dataset", str(path), "--multi-turn",
                   "--endpoint-type", "chat")
    assert result.exit_code == 0, result.output
    records = json.loads((run_dir_of(tmp_path / "out") / "levels/ar/c1.json").read_text())["records"]
    assert [r["prompt_id"] for r in records] == ["c0/2", "c1/1", "c1/2", "c2/1"]  # after the warm-up's c0/1
    second_turns = [body["messages"] for path_, _, body in server.seen
                    if path_ == "/v1/chat/completions" and len(body.get("messages", [])) == 3]
    assert second_turns[0] == [{"role": "user", "content": "the quick brown fox 0"},
                               {"role": "assistant", "content": "def f0(x): return x"},
                               {"role": "user", "content": "return x + 0 again"}]


@pytest.mark.parametrize("args, message", [
    (["--dataset", "sharegpt", "--input-len", "8"], "--dataset and --input-len each choose the prompts"),
    (["--multi-turn"], "--multi-turn replays a --dataset's conversations"),
    (["--dataset", "/no/such/file.json"], "/no/such/file.json: no such file"),
    (["--dataset", "sharegpt", "--suite", "spec_bench"], "--dataset replaces the suite's prompts"),
])
def test_a_bad_dataset_is_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["serve", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_each_request_is_answered_at_its_own_length(proxy, tiny_model_dir, tmp_path):
    result = serve(proxy.url, tmp_path, tiny_model_dir, "--input-len", "12", "--prefix-len", "6", "--range-ratio",
                   "0.5", "--requests", "8")
    assert result.exit_code == 0, result.output
    records = json.loads((run_dir_of(tmp_path) / "levels/ar/c1.json").read_text())["records"]
    lengths = [r["output_tokens"] for r in records]
    assert all(4 <= n <= 12 for n in lengths) and len(set(lengths)) > 1


def test_the_percentiles_asked_are_in_the_summary_and_its_csv(proxy, tiny_model_dir, tmp_path):
    result = serve(proxy.url, tmp_path, tiny_model_dir, "--percentiles", "99.9,95")
    assert result.exit_code == 0, result.output
    ttft = level(report_of(result), "c1")["ttft_ms"]
    assert set(ttft["more"]) == {"p95", "p99.9"} and ttft["p90"] <= ttft["more"]["p95"] <= ttft["more"]["p99.9"]
    header = (run_dir_of(tmp_path) / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"ttft_ms_p50", "ttft_ms_more_p95", "tpot_ms_more_p99.9"} <= set(header)


def test_a_server_listing_no_model_is_one_line(server, proxy, tiny_model_dir, tmp_path):
    server.models = []
    result = serve(proxy.url, tmp_path, tiny_model_dir)
    assert result.exit_code == 2, result.output
    assert f"--endpoint ar={proxy.url} lists no model at /v1/models" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "serve").exists()
