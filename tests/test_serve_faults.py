"""`specbench serve` against faults, on a real `vllm serve` of the embedded model that asks for an API key,
behind a fault-injecting proxy (tests/fault_proxy.py): each fault is one clear line or a level marked
incomplete with what was measured kept, `--resume` measures what is missing, and no process is left.

One server serves every test; tests/test_serve.py SIGKILLs specbench while it starts one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.serving.server import Server
from tests.fault_proxy import FaultProxy
from tests.helpers import SMALL_SERVER, write_tiny_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_installed")]
runner = CliRunner()
KEY = "specbench-test-key"
LEVEL = ["--concurrency", "1", "--requests", "4", "--warmup", "1", "--output-len", "16", "--json"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    from specbench.plan.run_config import RunConfig
    from specbench.serving.vllm_args import server_arguments

    config = RunConfig(strategies=["ar"], engine="vllm", engine_args=json.loads(SMALL_SERVER)).plan()
    arguments = {**server_arguments(config, lambda: None)["ar"], "api_key": KEY}
    with Server("ar", arguments, tmp_path_factory.mktemp("keyed") / "server.log", start_timeout=900) as server:
        yield server


@pytest.fixture
def proxy(keyed_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FaultProxy(keyed_server.url) as proxy:
        yield proxy


def serve(proxy: FaultProxy, out: Path, *extra: str, key: str | None = KEY):
    return runner.invoke(app, ["serve", "--endpoint", f"ar={proxy.url}", *LEVEL, "--out", str(out), *extra,
                               *(["--api-key", key] if key else [])])


def only_level(result) -> tuple[dict, dict]:
    report = json.loads(result.stdout)
    return report, report["levels"][0]


def test_without_the_key_the_endpoint_is_refused_in_one_line(proxy, tmp_path):
    result = serve(proxy, tmp_path, key=None)
    assert result.exit_code == 2, result.output
    assert "refused specbench's credentials (HTTP 401 at /v1/models)" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "serve").exists()


def test_the_key_and_headers_go_on_every_request_and_the_served_models_tokenizer_encodes(proxy, tmp_path):
    """No --tokenizer and no --model: the model /v1/models names is the embedded model's directory, found here."""
    result = serve(proxy, tmp_path, "--header", "X-Bench: faults")
    assert result.exit_code == 0, result.output
    report, level = only_level(result)
    assert report["complete"] and not report["notes"] and level["requests"] == 4 and level["errors"] == 0
    assert {"/v1/models", "/tokenize", "/v1/completions", "/metrics"} <= {path for path, _ in proxy.seen}
    assert all(headers.get("Authorization") == f"Bearer {KEY}" and headers.get("X-Bench") == "faults"
               for _, headers in proxy.seen)
    assert KEY not in (Path(report["run_dir"]) / "serve.json").read_text()  # credentials are not written
    records = json.loads(next(Path(report["run_dir"]).glob("levels/ar/c1.json")).read_text())["records"]
    assert len({r["prompt_id"] for r in records}) == 4 and all(r["token_ids"] for r in records)


def test_a_chat_endpoint_is_measured(proxy, tmp_path):
    result = serve(proxy, tmp_path, "--endpoint-type", "chat")
    assert result.exit_code == 0, result.output
    report, level = only_level(result)
    assert report["complete"] and level["errors"] == 0 and level["output_tokens"] == 4 * 16
    assert "/v1/chat/completions" in {path for path, _ in proxy.seen}


def test_a_served_model_not_found_here_needs_the_tokenizer_named(proxy, tmp_path):
    proxy.set("unknown_model")
    result = serve(proxy, tmp_path)
    assert result.exit_code == 2, result.output
    assert "serves 'remote-org/not-here', whose tokenizer is not available here: give it with --tokenizer" in \
        result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "serve").exists()


def test_a_tokenizer_that_is_not_the_servers_is_refused_in_one_line(proxy, tmp_path):
    other = tmp_path / "other-tokenizer"
    write_tiny_model_dir(other, "a different vocabulary, trained on other words entirely " * 40)
    result = serve(proxy, tmp_path / "out", "--tokenizer", str(other))
    assert result.exit_code == 2, result.output
    assert "its tokenizer is not the one given" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fault, first", [("500", "HTTP 500: injected HTTP 500"), ("reset", ""),
                                          ("stall", "no complete answer within 3 s")])
def test_a_fault_mid_level_leaves_it_incomplete_and_resume_measures_it(proxy, tmp_path, fault, first):
    """The warm-up and two measured requests pass, the last two meet the fault: the level is written with the two
    answers kept and two errors, marked incomplete with a note quoting the fault, and resume measures it again."""
    proxy.stall_s = 20
    proxy.set(fault, after=3)
    result = serve(proxy, tmp_path, "--request-timeout", "3")
    assert result.exit_code == 3, result.output
    report, level = only_level(result)
    assert not report["complete"] and not level["complete"] and report["incomplete"] == ["ar c1"]
    assert level["requests"] == 4 and level["errors"] == 2 and level["error_rate"] == 0.5
    assert any(f"2 of 4 requests at concurrency 1 failed (first: {first}" in note
               for note in report["notes"]), report["notes"]
    assert "incomplete: ar c1; resume it with: specbench serve --resume" in result.output
    proxy.set(None)
    resumed = runner.invoke(app, ["serve", "--resume", report["run_dir"], "--api-key", KEY, "--json"])
    assert resumed.exit_code == 0, resumed.output
    report, level = only_level(resumed)
    assert report["complete"] and level["complete"] and level["errors"] == 0 and level["requests"] == 4


def test_a_slow_first_byte_is_part_of_the_ttft(proxy, tmp_path):
    proxy.delay_s = 1.5
    proxy.set("slow_first_byte")
    result = serve(proxy, tmp_path, "--request-timeout", "30")
    assert result.exit_code == 0, result.output
    report, level = only_level(result)
    assert report["complete"] and level["errors"] == 0 and level["ttft_ms"]["p50"] >= 1500


def test_an_endpoint_that_dies_mid_level_is_marked_and_resume_measures_it(proxy, tmp_path):
    from specbench.serving.serve_config import serve_config
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import plan, serve_sweep, strategy_names

    config = serve_config({"max_new_tokens": 16, "out": str(tmp_path)}, KEY, concurrency=[1], requests=4, warmup=1,
                          endpoints={"ar": proxy.url})
    run = ServeRun.create(config, strategy_names(config), "the embedded model", config.run.suite)

    def die_after_two_answers(name, level, done, total) -> None:
        if done == 2:
            proxy.set("dead")

    report = serve_sweep(run, plan(config), die_after_two_answers).as_json()
    level = report["levels"][0]
    assert not report["complete"] and not level["complete"] and level["errors"] == 2
    assert any("stopped answering during concurrency 1" in note for note in report["notes"])
    proxy.set(None)
    resumed = runner.invoke(app, ["serve", "--resume", str(run.path), "--api-key", KEY, "--json"])
    assert resumed.exit_code == 0, resumed.output
    report, level = only_level(resumed)
    assert report["complete"] and level["complete"] and level["errors"] == 0
