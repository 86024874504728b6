"""`specbench serve`'s arithmetic on request logs with known times, and its bad input: no server needed."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.records.serve_records import (
    Agreement,
    Percentiles,
    RequestRecord,
    ServeResult,
    ServeVerdict,
    Speculation,
)
from specbench.serving.greedy_check import greedy_agreement
from specbench.serving.level_stats import against_baseline, level_summary
from specbench.serving.load import arrival_times
from specbench.serving.schedule import PAYS, STOPS, capacity, crossover, paying_until, speedup_verdict, vllm_schedule
from specbench.serving.server import cli_arguments, last_error
from specbench.serving.server_metrics import parse, speculation
from tests.helpers import record, served

runner = CliRunner()


def test_percentiles_and_goodput_of_a_known_log():
    # TTFTs 0.1..0.5 s, TPOT (e2e - ttft) / (tokens - 1): 0.01 s for the first four, 0.05 s for the last
    records = [record(i, 0.1 * (i + 1), 0.1 * (i + 1) + 0.09, 10, [0.01] * 9) for i in range(4)]
    records.append(record(4, 0.5, 0.95, 10, [0.05] * 9))
    records.append(record(5, 0.1, 0.2, 10, error="HTTP 500: boom"))
    summary = level_summary(records, duration_s=2.0, slo={"ttft": 350, "tpot": 20})
    assert summary.requests == 6 and summary.errors == 1
    assert summary.output_tokens == 50 and summary.output_tok_s == 25.0 and summary.req_s == 2.5
    assert summary.ttft_ms.p50 == pytest.approx(300.0)  # numpy's linear interpolation of 100..500
    assert summary.ttft_ms.p90 == pytest.approx(460.0)
    assert summary.tpot_ms.p50 == pytest.approx(10.0) and summary.tpot_ms.p99 == pytest.approx(48.4)
    assert summary.itl_ms.p99 == pytest.approx(50.0)  # 9 of the 45 gaps are 50 ms
    assert summary.e2e_ms.p50 == pytest.approx(390.0)
    assert summary.ttft_ms.n == 5 and summary.itl_ms.n == 45 and summary.few_for_p99
    assert summary.tok_s_per_user == pytest.approx(100.0)
    # met: requests 0, 1, 2 (TTFT 100, 200, 300 ms, TPOT 10 ms); request 3's TTFT and 4's TPOT miss; 5 failed
    assert summary.goodput_req_s == pytest.approx(1.5) and summary.slo_met == pytest.approx(0.5)
    low, high = summary.slo_met_ci  # 3 of 6: the exact interval
    assert low == pytest.approx(0.1181, abs=1e-4) and high == pytest.approx(0.8819, abs=1e-4)


def test_capacity_is_the_highest_load_where_the_share_of_requests_meeting_every_slo_is_shown():
    """Per request: a level where one request misses TTFT and another TPOT has two misses, though each metric's
    own p99 may pass. The share's exact 95% interval decides: 400 of 400 within it shows 0.99 (lower bound
    0.025 ** (1 / 400) = 0.9908), 390 of 400 shows below it, 20 of 20 is too few to tell."""
    from specbench.report.serve_tables import capacity_line, requests_to_show
    from specbench.serving.sweep import capacity

    def level(key, concurrency, good, total, errors=0):
        records = [record(i, 0.1, 0.1 + (0.01 if i < good else 0.05) * 3, 4) for i in range(total)]
        records += [record(total + i, 0.1, 0.2, 0, error="HTTP 500") for i in range(errors)]
        return served("ngram", key, concurrency, records, 10.0, {"tpot": 20})

    held = [level("c1", 1, 400, 400), level("c2", 2, 400, 400), level("c4", 4, 390, 400)]
    assert held[2].slo_met_ci[1] < 0.99 < held[0].slo_met_ci[0]
    assert capacity(held, 0.99) == ServeVerdict(capacity=2, slo_share=0.99, capacity_undecided=[])
    small = [level("c1", 1, 400, 400), level("c2", 2, 20, 20), level("c4", 4, 400, 400)]
    figures = capacity(small, 0.99)
    assert figures.capacity == 1 and figures.capacity_undecided == ["c2"]
    assert requests_to_show(0.99) == 368 and requests_to_show(0.9) == 36
    assert capacity_line("ngram", figures) == ("ngram: 99% of requests meet every SLO up to concurrency 1; too small "
                                               "to decide at c2 (the share's 95% interval holds 99%: 368 requests all "
                                               "within it would show it)")
    failed = capacity([level("c1", 1, 400, 400, errors=1)], 0.9)  # a failed request: no verdict, not undecided
    assert failed.capacity is None and failed.capacity_undecided == []


def test_itl_per_token_spreads_each_chunk_over_its_tokens(tmp_path):
    """A speculative chunk of 3 tokens 30 ms after the last is one 30 ms ITL per chunk and three of 10 ms per
    token; a level file written before chunks were counted reads back with no per-token ITL."""
    from specbench.core.files import read_json, write_json
    from specbench.core.records.serve_records import LevelFile

    chunky = RequestRecord(0, "p0", ttft=0.1, e2e=0.16, output_tokens=6, itl=[0.03, 0.01, 0.02],
                           chunk_tokens=[3, 1, 1])
    assert chunky.itl_per_token == pytest.approx([0.01, 0.01, 0.01, 0.01, 0.02])
    summary = level_summary([chunky], 1.0, {})
    assert summary.itl_ms.n == 3 and summary.itl_ms.p50 == pytest.approx(20.0)
    assert summary.itl_token_ms.n == 5 and summary.itl_token_ms.p50 == pytest.approx(10.0)
    old = {"index": 0, "prompt_id": "p0", "ttft": 0.1, "e2e": 0.16, "itl": [0.03], "output_tokens": 4}
    written = {"strategy": "ar", "level": {"concurrency": 1, "request_rate": None}, "complete": True,
               "duration_s": 1.0, "stopped_by_time": False, "speculation": None, "server": "u", "records": [old]}
    write_json(tmp_path / "level.json", written)
    level = LevelFile.from_dict(read_json(tmp_path / "level.json", "serve level file"), "level.json")
    (read_back,) = level.records
    assert read_back.itl_per_token == [] and level_summary([read_back], 1.0, {}).itl_token_ms.p50 is None


def test_the_steady_state_leaves_out_ramp_up_and_cooldown():
    """A closed loop of 2 clients, 8 requests: 0 and 1 arrive together on an empty server (ramp-up, their
    TTFT 500 ms), client A's requests take 1 s and B's 1.5 s; A sends the last (7) at 4 s and B's answer to 5
    at 4.5 s leaves B without work, so 7 ran while the load drained. An open loop of requests every 0.5 s,
    1.2 s each, fills up until the first answer (1.2 s) and drains after the last arrival (3.5 s)."""
    from specbench.serving.window import steady_state

    def timed(index, sent, e2e, ttft=0.1):
        return RequestRecord(index, f"p{index}", sent=sent, ttft=ttft, e2e=e2e, output_tokens=10, itl=[0.01] * 9)

    free = {1.0: 0.0, 1.5: 0.0}  # each client's request time -> when it is next free
    closed = []
    for index in range(8):  # the next request goes to the client free first, just after its last answer
        e2e = min(free, key=free.get)
        sent = free[e2e] + (0.001 if free[e2e] else 0.0)
        closed.append(timed(index, sent, e2e, ttft=0.5 if sent == 0.0 else 0.1))
        free[e2e] = sent + e2e
    assert [r.index for r in steady_state(closed)] == [2, 3, 4, 5, 6]
    summary = level_summary(closed, 4.5, {"ttft": 200})
    assert summary.steady_requests == 5 and summary.ttft_ms.n == 5 and summary.ttft_ms.p99 == 100.0
    assert summary.slo_met == 1.0 and summary.requests == 8 and summary.output_tokens == 80
    everything = level_summary(closed, 4.5, {}, steady=False)  # as vllm bench serve: the ramp's 500 ms counted
    assert everything.ttft_ms.n == 8 and everything.ttft_ms.p99 > 400
    opened = [timed(i, 0.5 * i, 1.2) for i in range(8)]
    assert [r.index for r in steady_state(opened)] == [3, 4, 5]
    one_wave = [timed(i, 0.0, 1.0 + i) for i in range(4)]  # every request sent before the first answer
    assert steady_state(one_wave) == [] and level_summary(one_wave, 4.0, {}).steady_requests == 0
    assert level_summary(one_wave, 4.0, {}).ttft_ms.n == 4


def test_ratios_against_ar_pair_requests_by_index():
    ar = [record(i, 0.1, 0.1 + 0.02 * 9, 10) for i in range(8)]
    fast = [record(i, 0.1, 0.1 + 0.01 * 9, 10) for i in range(8)]  # half ar's TPOT on every request
    ar_summary, fast_summary = level_summary(ar, 2.0, {}), level_summary(fast, 1.0, {})
    vs = against_baseline(fast, ar, fast_summary, ar_summary, seed=0)
    assert vs.tpot_speedup == pytest.approx(2.0) and vs.tpot_speedup_ci == pytest.approx([2.0, 2.0])
    assert vs.throughput_ratio == pytest.approx(2.0) and vs.paired_requests == 8
    uneven = [record(i, 0.1, 0.1 + (0.01 if i % 2 else 0.03) * 9, 10) for i in range(8)]
    vs = against_baseline(uneven, ar, level_summary(uneven, 2.0, {}), ar_summary, seed=0)
    low, high = vs.tpot_speedup_ci
    assert low < vs.tpot_speedup < high
    low, high = vs.throughput_ratio_ci
    assert low <= vs.throughput_ratio <= high and low < high


def test_open_loop_arrivals_are_seeded_poisson_and_burstier_below_one():
    times = arrival_times(rate=4.0, burstiness=1.0, count=4000, seed=0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert np.all(gaps > 0) and gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential: coefficient of variation 1
    bursty = np.diff(arrival_times(rate=4.0, burstiness=0.25, count=4000, seed=0))
    assert bursty.mean() == pytest.approx(0.25, rel=0.1) and bursty.std() / bursty.mean() > 1.6  # cv 1/sqrt(0.25)
    assert np.array_equal(times, arrival_times(4.0, 1.0, 4000, 0))  # the same for every strategy


def test_crossover_capacity_and_the_vllm_schedule():
    assert speedup_verdict([1.1, 1.5]) == PAYS and speedup_verdict([0.7, 0.95]) == STOPS
    assert speedup_verdict([0.9, 1.2]) is None and speedup_verdict(None) is None  # holds 1, or no ar
    assert crossover([(1, PAYS), (4, PAYS), (16, STOPS), (8, STOPS)]) == 8  # the lowest level shown below 1
    assert crossover([(1, PAYS), (4, PAYS)]) is None
    assert crossover([(1, None), (4, STOPS)]) is None  # no verdict at 1 (errors, too few, no ar): it may stop there
    assert crossover([(1, STOPS), (4, None)]) == 1
    assert paying_until([(1, PAYS), (4, None), (8, STOPS)]) == 4 and paying_until([(1, PAYS)]) is None
    assert capacity([(1, True), (4, True), (8, False), (16, True)]) == 4  # up to where every level held
    assert capacity([(1, False), (4, True)]) is None
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert vllm_schedule(spec, None) == spec  # pays everywhere measured: speculate everywhere
    assert vllm_schedule(spec, 1) is None  # pays nowhere: serve without speculation
    assert vllm_schedule(spec, 8) == {**spec, "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 8, 0]]}


@pytest.mark.vllm
def test_the_schedule_is_what_vllm_accepts(vllm_installed):
    """vLLM's own validation and lookup of `num_speculative_tokens_per_batch_size` take the exported form."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    form = vllm_schedule({"method": "ngram", "num_speculative_tokens": 4}, 8)
    lookup = build_dynamic_sd_schedule_lookup(form["num_speculative_tokens_per_batch_size"], 32, 4)
    assert lookup[1:8] == [4] * 7 and lookup[8:] == [0] * 25


METRICS_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_metrics_deltas_give_the_levels_tau_and_acceptance():
    after = (METRICS_BEFORE.replace("} 10.0", "} 110.0").replace("} 30.0", "} 330.0").replace("} 12.0", "} 162.0")
             .replace("} 7.0", "} 87.0").replace("} 4.0", "} 54.0").replace("} 1.0\n", "} 21.0\n"))
    before = parse(METRICS_BEFORE)
    assert before == {"drafts": 10.0, "draft_tokens": 30.0, "accepted": 12.0, "by_position": [7.0, 4.0, 1.0]}
    # 400 tokens: 150 accepted drafts and 250 forwards, of which 100 carried a draft (ngram without a match
    # proposes nothing): 2.5 tokens per drafting step, vLLM's tau; 1.6 per forward, run's
    level = speculation(before, parse(after), output_tokens=400)
    assert level.drafts == 100 and level.accepted == 150
    assert level.tau == pytest.approx(2.5) and level.draft_efficiency == pytest.approx(0.5)
    assert level.tokens_per_step == pytest.approx(1.6)
    assert level.acceptance_by_position == pytest.approx([0.8, 0.5, 0.2])
    assert speculation({}, parse("# TYPE x gauge\nx 1.0\n"), 400) is None  # `ar`, or a server without the counters
    sglang = parse("# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name=\"m\"} 3.25\n")
    assert speculation({}, sglang, 400).as_dict() == {"source": "sglang", "tau": 3.25}


def test_the_lossless_check_catches_a_planted_mismatch():
    ar = [record(i, 0.1, 0.5, 4, ids=[5, 6, 7, 8]) for i in range(3)]
    same = [record(i, 0.1, 0.4, 4, ids=[5, 6, 7, 8]) for i in range(3)]
    assert greedy_agreement(same, ar) == Agreement(compared=3, mismatches=0, unit="token", first_divergence={})
    planted = [*same[:2], record(2, 0.1, 0.4, 4, ids=[5, 6, 9, 8])]
    assert greedy_agreement(planted, ar) == Agreement(3, 1, "token", {2: 2})
    texts = [RequestRecord(0, "p0", ttft=0.1, e2e=0.2, output_tokens=2, text="ab")]
    assert greedy_agreement(texts, [RequestRecord(0, "p0", ttft=0.1, e2e=0.2, output_tokens=2, text="ax")]) == (
        Agreement(1, 1, "character", {0: 1}))


def test_engine_arguments_become_server_flags():
    assert cli_arguments({"model": "/m", "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
                          "speculative_config": {"method": "ngram"}, "quantization": None}) == [
        "--model", "/m", "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0",
        "--speculative-config", '{"method": "ngram"}']


def test_the_watchdog_stops_the_group_when_its_holder_is_killed():
    """A process holding a watchdog's pipe, as specbench does, is SIGKILLed: the watched process group goes."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    watched = subprocess.Popen(["sleep", "600"], start_new_session=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-m', 'specbench.serving.watchdog', '{watched.pid}', '5'], "
        "stdin=subprocess.PIPE, start_new_session=True)\n"
        "print('ready', flush=True)\ntime.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    assert watched.poll() is None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    deadline = time.monotonic() + 20
    while watched.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watched.returncode == -signal.SIGTERM

    def watchdogs() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] and p.info["cmdline"][-2:] == [str(watched.pid), "5"]]

    while watchdogs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not watchdogs()  # its work done, the watchdog exits too


def test_a_cpu_servers_kv_cache_is_sized_for_the_levels():
    from specbench.plan.run_config import RunConfig
    from specbench.serving.vllm_args import server_arguments

    config = RunConfig(strategies=["ngram"], engine="vllm").plan()
    sized = server_arguments(config, lambda: None, kv_tokens=100_000)
    assert sized["ar"]["kv_cache_memory_bytes"] == sized["ngram"]["kv_cache_memory_bytes"] > 0
    small = server_arguments(config, lambda: None, kv_tokens=10)["ar"]["kv_cache_memory_bytes"]
    assert small < sized["ar"]["kv_cache_memory_bytes"]  # at least max_model_len's tokens, however few in flight
    given = RunConfig(strategies=["ngram"], engine="vllm", engine_args={"gpu_memory_utilization": 0.5}).plan()
    assert "kv_cache_memory_bytes" not in server_arguments(given, lambda: None, kv_tokens=100_000)["ar"]


def test_a_failed_start_quotes_the_servers_last_error(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nValueError: num_speculative_tokens must be > 0\nINFO shutting down\n")
    assert last_error(log) == "ValueError: num_speculative_tokens must be > 0"
    log.write_text("ValidationError: 1 validation error for ModelConfig\n"
                   "  Value error, max_model_len 10000000 too big\n")
    assert last_error(log) == "Value error, max_model_len 10000000 too big"
    log.write_text("usage: api_server.py [-h]\n                     [--jit-monitor-mode {error,warn}]\n"
                   "api_server.py: error: argument --logging-config: invalid loads value: 'x'\n")
    assert last_error(log) == "api_server.py: error: argument --logging-config: invalid loads value: 'x'"


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "0"], "--concurrency 0: every size must be an integer of at least 1"),
    (["--concurrency", "1,x"], "--concurrency 1,x: expected a comma list of integers"),
    (["--request-rate", "0"], "--request-rate 0: every rate must be a number of requests per second above 0"),
    (["--request-rate", "2,1"], "--request-rate 2,1: list the rates in increasing order"),
    (["--slo", "ttft=fast"], "--slo ttft=fast: expected ttft=MS,tpot=MS,e2e=MS"),
    (["--slo", "p99=5"], "--slo p99=5: expected"),
    (["--endpoint", "ar=ftp://host"], "is not an http(s) URL"),
    (["--endpoint", "ar"], "--endpoint ar: expected NAME=URL"),
    (["--endpoint", "ar=http://127.0.0.1:9"], "does not answer"),
    (["--endpoint", "ar=http://127.0.0.1:9", "--strategy", "ngram"], "drop them"),
    (["--endpoint", "ar=http://127.0.0.1:9", "--header", "Authorization Bearer sk-secret"],
     "--header number 1 (30 characters, not shown: it may hold a secret): expected NAME:VALUE"),
    (["--endpoint", "ar=http://user:sk-secret@127.0.0.1:9"],
     "--endpoint ar=http://127.0.0.1:9: credentials or a query inside the URL (not shown)"),
    (["--endpoint", "ar=http://127.0.0.1:9/?token=sk-secret"], "--endpoint ar=http://127.0.0.1:9/: credentials"),
    (["--engine-args", '{"api_key": "sk-secret"}'], "--engine-args api_key: the servers specbench starts"),
    (["--header", "X-Team:bench"], "--header is sent to --endpoint servers"),
    (["--tokenizer", "/tmp"], "--tokenizer names an --endpoint server's tokenizer"),
    (["--endpoint", "ar=http://127.0.0.1:9", "--endpoint-type", "embeddings"], "--endpoint-type embeddings: expected"),
    (["--concurrency", "16", "--limit", "8"], "8 prompts for 66 distinct requests (2 warm-up, 64 at concurrency 16)"),
    (["--percentiles", "95,100"], "--percentiles 95,100: expected a comma list of percentiles above 0 and below"),
    (["--range-ratio", "0.5"], "--range-ratio spreads --input-len and --output-len: give either"),
    (["--input-len", "8", "--range-ratio", "1"], "--range-ratio must be"),
    (["--prefix-len", "8"], "--prefix-len is the shared start of synthetic prompts: give --input-len too"),
    (["--output-len", "8", "--max-new-tokens", "8"], "--output-len fixes every answer's length; drop --max-new-tokens"),
    (["--input-len", "0"], "--input-len must be"),
    (["--slo-share", "0.9"], "--slo-share is the share of requests that must meet --slo: give --slo too"),
    (["--slo", "tpot=50", "--slo-share", "1"], "--slo-share must be"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    result = runner.invoke(app, ["serve", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert "sk-secret" not in result.output and not (tmp_path / "out").exists()


def test_each_request_of_a_level_has_a_prompt_of_its_own():
    """Without --limit the suite gives as many prompts as the warm-up and the largest level need; synthetic
    prompts have the length asked and no special token."""
    from transformers import AutoTokenizer

    from specbench.decoding.model_source import model_path
    from specbench.serving.prompts import synthetic_prompts
    from specbench.serving.serve_config import serve_config
    from specbench.serving.sweep import workload

    config = serve_config({}, concurrency=[1, 4, 8], warmup=3, output_len=16)
    work = workload(config)
    assert config.prompts_needed == 3 + 32 and len({p.id for p in work.prompts}) == 35
    assert work.max_tokens == 16 and work.ignore_eos
    tokenizer = AutoTokenizer.from_pretrained(model_path(None))
    prompts = synthetic_prompts(tokenizer, 5, 12, seed=0)
    assert [len(p.token_ids) for p in prompts] == [12] * 5 and len({tuple(p.token_ids) for p in prompts}) == 5
    assert not set(tokenizer.all_special_ids) & {t for p in prompts for t in p.token_ids}
    assert synthetic_prompts(tokenizer, 5, 12, seed=0) == prompts


def test_lengths_spread_by_the_range_ratio_and_a_shared_prefix():
    """As vllm bench serve's random dataset: input and output lengths uniform within (1 +- ratio) x the asked,
    every prompt starting with the same random prefix."""
    from specbench.serving.serve_config import serve_config
    from specbench.serving.sweep import workload

    config = serve_config({}, concurrency=[16], warmup=0, requests=200, input_len=20, output_len=10, range_ratio=0.5,
                          prefix_len=7)
    work = workload(config)
    inputs = [len(p.token_ids) - 7 for p in work.prompts]
    outputs = [p.max_tokens for p in work.prompts]
    assert min(inputs) == 10 and max(inputs) == 30 and len(set(inputs)) > 15
    assert min(outputs) == 5 and max(outputs) == 15 and work.max_tokens == 15
    assert len({tuple(p.token_ids[:7]) for p in work.prompts}) == 1 and len({p.token_ids[7] for p in work.prompts}) > 1


def test_level_tables_fit_80_columns():
    from specbench.report.serve_tables import level_tables

    entry = served("ar", "c16", 16, [record(0, 0.1, 0.2, 4)], output_tok_s=12345.6, errors=10, requests=999,
                   ttft_ms=Percentiles(1234.5, None, None, 999), tpot_ms=Percentiles(123.45, None, 456.78, 999),
                   goodput_req_s=12.34, speculation=Speculation(source="vllm", tau=3.21), tpot_speedup=1.234,
                   tpot_speedup_ci=[1.111, 1.456], lossless=Agreement(64, 12, "token", {}))
    console = Console(width=80, record=True)
    for table in level_tables([entry, replace(entry, strategy="dflash")], slo=True):
        console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "1.23 (1.11-1.46)" in text and "12/64" in text and "1%" in text


def test_recommend_for_a_load_reads_serve_runs(tmp_path):
    from specbench.core.files import write_json

    answered = [record(i, 0.1, 0.2, 4) for i in range(8)]

    def level(strategy, concurrency, speedup, mismatches=0):
        return served(strategy, f"c{concurrency}", concurrency, answered, baseline_errors=0, tpot_speedup=speedup,
                      tpot_speedup_ci=[speedup - 0.1, speedup + 0.1], throughput_ratio=speedup,
                      throughput_ratio_ci=[speedup, speedup], paired_requests=8,
                      lossless=Agreement(8, mismatches, "token", {}))

    run = tmp_path / "serve" / "one"
    run.mkdir(parents=True)
    write_json(run / "serve.json", {"kind": "serve", "model": "m", "config": {}})
    levels = [served("ar", "c1", 1, answered), level("ngram", 1, 1.3), level("dflash", 1, 1.8, mismatches=1),
              level("eagle", 1, 1.5), level("ngram", 8, 0.9), level("eagle", 8, 0.95)]
    eagle = ServeVerdict(crossover=8, errors={}, undecided=[])
    write_json(run / "summary.json", ServeResult(run, levels, {"eagle": eagle},
                                                 schedules={"eagle": {"method": "eagle3"}}).as_json())
    result = runner.invoke(app, ["recommend", "--concurrency", "1", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("at concurrency 1: eagle, TPOT 1.50x")  # dflash is faster but not lossless
    assert "stops paying at concurrency 8" in result.output and "dflash: TPOT speedup 1.80" in result.output
    result = runner.invoke(app, ["recommend", "--concurrency", "8", "--results", str(tmp_path)])
    assert result.output.startswith("at concurrency 8: plain decoding (ar)")
    result = runner.invoke(app, ["recommend", "--concurrency", "4", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "measured: 1, 8" in result.output


def test_summary_pairs_levels_and_keeps_an_incomplete_one_visible(tmp_path):
    from specbench.plan.run_config import RunConfig
    from specbench.report.serve_tables import decisions
    from specbench.serving.serve_config import Level, ServeConfig
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import summarise

    config = ServeConfig(plan=RunConfig(strategies=["ngram"], out=str(tmp_path)).plan(), concurrency=[1, 4],
                         slo={"tpot": 15})
    run = ServeRun.create(config, ["ar", "ngram"], "m", "s")
    ids = [1, 2, 3, 4]
    fast = [record(i, 0.1, 0.1 + 0.01 * 3, 4, ids=ids) for i in range(4)]
    slow = [record(i, 0.1, 0.1 + 0.02 * 3, 4, ids=ids) for i in range(4)]
    for level, ar, ngram in ((Level(concurrency=1), slow, fast), (Level(concurrency=4), fast, slow)):
        run.write_level("ar", level, ar, complete=True, duration_s=1.0, stopped_by_time=False, speculation=None)
    run.write_level("ngram", Level(concurrency=1), fast, complete=True, duration_s=1.0, stopped_by_time=False,
                    speculation=Speculation(source="vllm", tau=2.0))
    died = [*slow[:2], record(2, 0.1, 0.2, 0, error="ServerDisconnectedError"), record(3, 0.1, 0.2, 0, error="x")]
    run.write_level("ngram", Level(concurrency=4), died, complete=False, duration_s=1.0, stopped_by_time=False,
                    speculation=None)
    result = summarise(run, {"ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}})
    assert not result.complete
    c1 = next(e for e in result.levels if e.strategy == "ngram" and e.level == "c1")
    assert c1.tpot_speedup == pytest.approx(2.0) and c1.lossless.mismatches == 0
    c4 = next(e for e in result.levels if e.strategy == "ngram" and e.level == "c4")
    assert not c4.complete and c4.errors == 2 and c4.tpot_speedup == pytest.approx(0.5)
    assert result.strategies["ngram"].crossover is None  # its failed requests at 4 leave it without a verdict
    assert result.strategies["ngram"].undecided == []  # every pair of requests alike: intervals of one point
    ngram = result.strategies["ngram"]
    assert ngram.errors == {"c4": 2} and "ngram" not in result.schedules
    # every request at 1 within 15 ms, but 4 are too few to show 99% of them; at 4 it failed
    assert ngram.capacity is None and ngram.capacity_undecided == ["c1"]
    assert result.strategies["ar"].capacity is None  # ar's TPOT is 20 ms at concurrency 1: shown below
    assert result.strategies["ar"].capacity_undecided == ["c4"]  # all 4 within it: too few to show 99%
    assert any("ngram at c4: incomplete" in line for line in decisions(result.strategies, result.levels))
    assert run.measured("ngram", Level(concurrency=4)) is None  # resume measures it again


def test_a_level_with_errors_gives_no_verdict_and_exports_no_setting(tmp_path):
    """ngram pays at concurrency 1 and loses at 4, but one of ar's requests failed at 1 and one of its own at 4:
    neither level is a verdict, so it reads "errors", never "pays" or "stops paying", and no setting is exported."""
    from specbench.plan.run_config import RunConfig
    from specbench.report.serve_tables import decisions, level_tables, levels_csv
    from specbench.serving.serve_config import Level, ServeConfig
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import summarise

    config = ServeConfig(plan=RunConfig(strategies=["ngram"], out=str(tmp_path)).plan(), concurrency=[1, 4])
    run = ServeRun.create(config, ["ar", "ngram"], "m", "s")
    fast = [record(i, 0.1, 0.1 + 0.01 * 3, 4) for i in range(4)]
    slow = [record(i, 0.1, 0.1 + 0.02 * 3, 4) for i in range(4)]
    failed = record(3, 0.1, 0.2, 0, error="HTTP 500: boom")
    written = {("ar", 1): [*slow[:3], failed], ("ngram", 1): fast, ("ar", 4): fast, ("ngram", 4): [*slow[:3], failed]}
    for (strategy, concurrency), records in written.items():
        run.write_level(strategy, Level(concurrency=concurrency), records, complete=True, duration_s=1.0,
                        stopped_by_time=False, speculation=None)
    result = summarise(run, {"ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}})
    ngram = result.strategies["ngram"]
    assert ngram.errors == {"c1": 1, "c4": 1} and ngram.crossover is None
    assert "ngram" not in result.schedules
    c4 = next(e for e in result.levels if e.strategy == "ngram" and e.level == "c4")
    assert c4.errors == 1 and c4.error_rate == 0.25
    said = decisions(result.strategies, result.levels)
    assert any(line.startswith("ngram: errors (failed requests, its own and ar's: 1 at c1, 1 at c4)") for line in said)
    assert not any("pays" in line or "paying" in line for line in said)
    assert any(line.startswith("p99s from too few requests") and "ngram at c4 (3)" in line for line in said)
    console = Console(width=80, record=True)
    for table in level_tables(result.levels, slo=False):
        console.print(table)
    assert "25%" in console.export_text()
    rows = list(csv.DictReader(io.StringIO(levels_csv(result.levels))))
    assert len(rows) == 4 and float(rows[-1]["error_rate"]) == 0.25 and rows[-1]["strategy"] == "ngram"
    assert {"ttft_ms_p50", "tpot_ms_n", "tpot_speedup_ci_low", "tpot_speedup_ci_high", "lossless_mismatches"} <= set(
        rows[-1])


def test_a_speedup_whose_interval_holds_one_is_undecided(tmp_path):
    from specbench.plan.run_config import RunConfig
    from specbench.report.serve_tables import decisions
    from specbench.serving.serve_config import Level, ServeConfig
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import summarise

    run = ServeRun.create(ServeConfig(plan=RunConfig(strategies=["ngram"], out=str(tmp_path)).plan(), concurrency=[1]),
                          ["ar", "ngram"], "m", "s")
    halves = [record(i, 0.1, 0.1 + (0.01 if i % 2 else 0.04) * 3, 4) for i in range(8)]  # twice and half ar's speed
    for strategy, records in (("ar", [record(i, 0.1, 0.1 + 0.02 * 3, 4) for i in range(8)]), ("ngram", halves)):
        run.write_level(strategy, Level(concurrency=1), records, complete=True, duration_s=1.0, stopped_by_time=False,
                        speculation=None)
    result = summarise(run, {"ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}})
    ngram = result.strategies["ngram"]
    assert ngram.undecided == ["c1"] and ngram.crossover is None
    assert result.schedules["ngram"] is None  # not shown to pay at 1: served without speculation
    said = decisions(result.strategies, result.levels)
    assert any(line.startswith("ngram: too small to decide at c1 (the TPOT speedup's 95% interval holds 1")
               and line.endswith("where it stops paying is undecided") for line in said)
    assert not any("pays" in line or "stops paying at" in line for line in said)


def test_a_crossover_is_where_the_interval_lies_below_one(tmp_path):
    """ngram pays at 1 (interval above 1), its point estimate is below 1 at 4 but its interval holds 1, and at
    8 the interval lies below 1: 4 is too small to decide, so where it stops paying (4 or 8) is undecided, and
    its schedule speculates below 4 only."""
    from specbench.plan.run_config import RunConfig
    from specbench.report.serve_tables import decisions
    from specbench.serving.serve_config import Level, ServeConfig
    from specbench.serving.serve_dir import ServeRun
    from specbench.serving.sweep import summarise

    config = ServeConfig(plan=RunConfig(strategies=["ngram"], out=str(tmp_path)).plan(), concurrency=[1, 4, 8])
    run = ServeRun.create(config, ["ar", "ngram"], "m", "s")
    ar = [record(i, 0.1, 0.1 + 0.02 * 3, 4) for i in range(8)]
    ngram = {1: [record(i, 0.1, 0.1 + 0.01 * 3, 4) for i in range(8)],
             4: [record(i, 0.1, 0.1 + (0.01 if i % 2 else 0.05) * 3, 4) for i in range(8)],  # 0.89, holds 1
             8: [record(i, 0.1, 0.1 + 0.04 * 3, 4) for i in range(8)]}
    for concurrency, records in ngram.items():
        for strategy, written in (("ar", ar), ("ngram", records)):
            run.write_level(strategy, Level(concurrency=concurrency), written, complete=True, duration_s=1.0,
                            stopped_by_time=False, speculation=None)
    result = summarise(run, {"ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}})
    c4 = next(e for e in result.levels if e.strategy == "ngram" and e.level == "c4")
    assert c4.tpot_speedup < 1 < c4.tpot_speedup_ci[1]
    figures = result.strategies["ngram"]
    assert figures.crossover is None and figures.undecided == ["c4"]
    assert result.schedules["ngram"]["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 4, 0]]
    said = decisions(result.strategies, result.levels)
    assert any(line.startswith("ngram: too small to decide at c4") and line.endswith("is undecided") for line in said)
    assert not any("still pays" in line or "stops paying at" in line for line in said)


def test_resume_takes_no_other_option_and_refuses_a_complete_run(tmp_path):
    from specbench.plan.run_config import RunConfig
    from specbench.serving.serve_config import ServeConfig
    from specbench.serving.serve_dir import ServeRun

    run = ServeRun.create(ServeConfig(plan=RunConfig(out=str(tmp_path)).plan(), concurrency=[1]), ["ar"], "m", "s")
    result = runner.invoke(app, ["serve", "--resume", str(run.path), "--limit", "3"])
    assert result.exit_code == 2 and "drop --limit" in result.output
    run.finish(complete=True)
    result = runner.invoke(app, ["serve", "--resume", str(run.path)])
    assert result.exit_code == 2 and "is complete" in result.output
    result = runner.invoke(app, ["serve", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "not a specbench serve run directory" in result.output


def test_a_study_at_a_load_asks_its_own_question():
    """tune at a load: goodput at the SLO is maximised, the TPOT p50 minimised without one, and the load and
    SLO are part of the study's identity (a study at another load is refused, not resumed)."""
    from specbench.methods.names import parse_strategy
    from specbench.plan.run_config import RunConfig
    from specbench.tuning.study import question
    from specbench.tuning.study_config import TuneConfig

    workload = RunConfig(limit=2)
    at_two = TuneConfig(workload, ("ngram",), concurrency=2)
    with_slo = TuneConfig(workload, ("ngram",), concurrency=2, slo={"tpot": 50.0})
    at_rate = TuneConfig(workload, ("ngram",), request_rate=1.5)
    assert at_two.directions == ("minimize",) and with_slo.directions == ("maximize",)
    assert TuneConfig(workload, ("ngram",)).load is None and at_rate.load.key == "r1.5"
    ngram = parse_strategy("ngram")
    asked = [question(c, ngram) for c in (at_two, with_slo, at_rate, TuneConfig(workload, ("ngram",)))]
    assert asked[0]["serve"] == {"load": "c2", "slo": {}, "engine_args": {}} and "serve" not in asked[3]
    assert len({str(a) for a in asked}) == 4
