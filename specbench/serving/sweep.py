"""`specbench serve`'s pipeline: for each strategy, a server (or a running endpoint), every load level in
turn, each level written as it ends; then every level against `ar`'s, the crossovers, the capacities at
the SLO and the per-load vLLM setting.

Servers are stopped whatever happens (success, a bad level, Ctrl-C, SIGTERM turned into one by the CLI).
A server that does not start ends its strategy with the server's own last error; the others still run.
Every failure is a state: a level where a request failed (any HTTP error, an error object or a malformed
line in the stream, a lost connection, a timeout) or whose server died is written incomplete, with a note
quoting the first failure, and `--resume` measures it again; a level whose server names no model at its
start or keeps its prefix cache is not measured, with a note; a refusal of the credentials stops the run in
one line. A run that ends with any level incomplete says which.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from specbench.core.errors import Interrupted, SpecbenchError, Stopped
from specbench.core.files import read_json, write_atomic, write_json
from specbench.core.records.serve_records import LevelFile, LevelKey, ServeLevel, ServeResult, ServeVerdict
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunPlan
from specbench.serving import schedule
from specbench.serving.client import ModelsFailed
from specbench.serving.endpoint import AUTH_STATUSES, answers, check_tokenizer, endpoint_tokenizer, is_vllm
from specbench.serving.greedy_check import greedy_agreement
from specbench.serving.level_stats import against_baseline, level_summary
from specbench.serving.load import LevelLog, Workload, drive
from specbench.serving.prompts import dataset_prompts, suite_prompts, synthetic_prompts, with_answer_lengths
from specbench.serving.serve_config import Level, ServeConfig, ServeLoad
from specbench.serving.serve_dir import ServeRun
from specbench.serving.server import Server

RESET_TRIES = 10  # a second apart
DRAFT_TOKENS_AT_MOST = 16  # a verify step's draft tokens beyond the answer, at most (the knobs' ranges end below)
Progress = Callable[[str, Level, int, int], None]  # strategy, level, requests answered, requests of the level


def strategy_names(config: ServeConfig) -> list[str]:
    """`ar` first, then the strategies (or the endpoints' names, `ar` among them if given)."""
    if config.endpoints:
        return sorted(config.endpoints, key=lambda name: name != BASELINE)
    return [s.name for s in config.plan.strategies]


def workload(config: ServeConfig, tokenizer=None, vllm: bool = True) -> Workload:
    """The prompts (the suite's or the --dataset's under the chat template of `tokenizer`, the target's unless
    given, or synthetic ones of --input-len tokens) and how each is answered (--output-len: exactly that long,
    where the servers are `vllm`)."""
    if tokenizer is None:
        tokenizer = model_tokenizer(config)
    run = config.run
    if config.input_len is not None:
        prompts = synthetic_prompts(tokenizer, config.prompts_needed, config.input_len, run.seed, config.range_ratio,
                                    config.prefix_len)
    elif config.dataset is not None:
        prompts = dataset_prompts(tokenizer, config.dataset, run.limit or config.prompts_needed, config.multi_turn)
    else:
        prompts = suite_prompts(tokenizer, config.plan.suite.items)
    max_tokens = config.output_len or run.max_new_tokens
    if config.output_len is not None and config.range_ratio:
        prompts = with_answer_lengths(prompts, config.output_len, config.range_ratio, run.seed)
        max_tokens = max(p.max_tokens for p in prompts)
    return Workload(prompts, max_tokens, run.temperature, run.seed, ignore_eos=config.output_len is not None,
                    endpoint_type=config.endpoint_type, vllm=vllm)


def model_tokenizer(config: ServeConfig):
    """The target's tokenizer, for the servers specbench starts."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.plan.model, local_files_only=True)


def checked_tokenizer(config: ServeConfig) -> tuple[Any, list[str]]:
    """The endpoints' tokenizer, checked against every endpoint that can tell, and a note for each that cannot."""
    model_dir = config.plan.model if config.run.model else None
    tokenizer = endpoint_tokenizer(config.tokenizer, model_dir, config.endpoints, config.headers)
    return tokenizer, [f"{name}: {url} has no /tokenize and counts no prompt tokens: the prompts' tokenizer was not "
                       "checked against it" for name, url in config.endpoints.items()
                       if not check_tokenizer(name, url, tokenizer, config.headers)]


def endpoint_notes(config: ServeConfig, vllm: dict[str, bool]) -> list[str]:
    """What the run directory says of the endpoints: those not vLLM, and how their levels are kept clean."""
    notes = []
    others = [name for name, is_vllm in vllm.items() if not is_vllm]
    if others:
        notes.append(f"{', '.join(others)}: not vLLM (/v1/models): every request carries the standard fields alone "
                     "(no return_token_ids: answers compared as text"
                     f"{'; no ignore_eos: --output-len caps answers' if config.output_len else ''})")
    if len(config.levels) > 1:
        repeats = " (--repeat-prompts: once they run out, a level repeats earlier ones)" if config.repeat_prompts \
            else ""
        notes.append("each level sends prompts no earlier level sent: an endpoint's prefix cache is its own and is "
                     f"not emptied between levels{repeats}")
    return notes


def emptied(server: Server) -> bool:
    """Whether the server emptied its prefix cache; vLLM refuses while requests still hold blocks, so it is asked
    again for a few seconds."""
    for _ in range(RESET_TRIES):
        if server.reset_prefix_cache():
            return True
        time.sleep(1.0)
    return False


def measure_level(run: ServeRun, strategy: str, url: str, level: Level, work: Workload, config: ServeConfig,
                  server: Server | None, progress: Progress | None) -> bool:
    """Measure one level and write it, a note for whatever went wrong; False where the strategy's later levels
    cannot be measured (its server died or stopped answering, named no model, or kept its prefix cache).
    Any failed request leaves the level written incomplete: resume measures it again. A refusal of the
    credentials (401, 403) stops the run, the level written first."""
    requests = config.requests_at(level)
    answered = 0
    again = "--resume measures it again"

    def tick() -> None:
        nonlocal answered
        answered += 1
        if progress:
            progress(strategy, level, answered, requests)

    if progress:
        progress(strategy, level, 0, requests)
    if server is not None and not emptied(server):
        run.note(f"{strategy}: the server did not empty its prefix cache before {level.label}: the level is not "
                 f"measured; {again}")
        return False
    try:
        log = measure(url, level, work, config, requests, tick)
    except ModelsFailed as exc:
        if exc.status in AUTH_STATUSES:
            raise Stopped(run.path, f"{strategy}: {url} refused specbench's credentials (HTTP {exc.status} at "
                                    f"/v1/models) before {level.label}") from None
        run.note(f"{strategy}: {url} named no model at /v1/models before {level.label} ({exc}): the level is not "
                 f"measured; {again}")
        return False
    died = not server.serving() if server is not None else not answers(url, config.headers)
    failed = [r for r in log.records if r.error]
    if died:
        run.note(f"{strategy}: the server died during {level.label} (log: {server.log})" if server is not None else
                 f"{strategy}: {url} stopped answering during {level.label}")
        run.note(f"{strategy}: {len(failed)} of {len(log.records)} requests at {level.label} failed; the level is "
                 f"incomplete: {again}")
    elif failed:
        run.note(f"{strategy}: {len(failed)} of {len(log.records)} requests at {level.label} failed (first: "
                 f"{failed[0].error}); the level is incomplete: {again}")
    if log.counters_missing:
        run.note(f"{strategy}: {level.label} has no speculative counters: {log.counters_missing}")
    run.write_level(strategy, level, log.records, complete=not died and not failed, duration_s=log.duration_s,
                    stopped_by_time=log.stopped_by_time, speculation=log.speculation, server=url,
                    counters_missing=log.counters_missing)
    refused = next((r for r in failed if r.http_status in AUTH_STATUSES), None)
    if refused is not None:
        raise Stopped(run.path, f"{strategy}: {url} refused specbench's credentials (HTTP {refused.http_status}) "
                                f"during {level.label}")
    return not died


def measure(url: str, level: Level, work: Workload, config: ServeConfig, requests: int,
            on_answer: Callable[[], None] | None = None) -> LevelLog:
    """One level on the server at `url`: its request log and the server's speculative figures over it;
    ModelsFailed where the server names no model at the level's start."""
    return asyncio.run(drive(url, level, work, requests, config.warmup, config.level_seconds, config.max_concurrency,
                             config.burstiness, on_answer=on_answer, headers=config.headers,
                             request_timeout=config.request_timeout, first_prompt=config.first_prompt(level)))


def kv_tokens(config: ServeConfig, work: Workload) -> int:
    """Tokens the levels keep in flight at most: every client's longest prompt, answer and a full draft."""
    in_flight = max(level.concurrency or config.max_concurrency or config.requests_at(level) for level in config.levels)
    return in_flight * (max(len(p.token_ids) for p in work.prompts) + work.max_tokens + DRAFT_TOKENS_AT_MOST)


@dataclass(frozen=True)
class ServePlan:
    """What a serve run needs, made before anything is written: the prompts, each strategy's server arguments."""

    work: Workload
    arguments: dict[str, dict[str, Any]]  # strategy -> vLLM engine arguments; empty with --endpoint
    notes: list[str] = field(default_factory=list)  # for the run directory: what could not be checked


def plan(config: ServeConfig) -> ServePlan:
    """The prompts and every strategy's server arguments; too few prompts for distinct requests, a strategy vLLM
    cannot run, an endpoint that does not answer or refuses the credentials, and a tokenizer that is not the
    endpoint's are refused here."""
    if config.endpoints:
        vllm = {name: is_vllm(name, url, config.headers) for name, url in config.endpoints.items()}
        tokenizer, notes = checked_tokenizer(config)
        work = workload(config, tokenizer, all(vllm.values()))
        config.check_prompts(len(work.prompts))
        return ServePlan(work, {}, notes + endpoint_notes(config, vllm))
    from specbench.serving.vllm_args import server_arguments

    work = workload(config)
    config.check_prompts(len(work.prompts))
    target_loader = cache(lambda: load_target_for(config.plan))
    return ServePlan(work, server_arguments(config.plan, target_loader, kv_tokens(config, work)))


def serve(config: ServeConfig, progress: Progress | None = None) -> ServeResult:
    """A new serve run of `config`: its prompts and servers' arguments made, then its directory, then every level.
    `progress` is told the requests answered and to answer of all the levels together."""
    prepared = plan(config)  # drafters converted, prompts encoded: before the run directory exists
    run = ServeRun.create(config, strategy_names(config), config.run.model or "the embedded model", config.run.suite)
    for note in prepared.notes:
        run.note(note)
    return serve_sweep(run, prepared, overall(run, progress) if progress else None)


def resume(path: Path, api_key: str | None = None, headers: dict[str, str] | None = None,
           progress: Progress | None = None) -> ServeResult:
    """The levels an interrupted serve run has not finished, with its saved configuration; `progress` as serve's."""
    run = ServeRun.resume(path, api_key, headers)
    return serve_sweep(run, plan(run.config), overall(run, progress) if progress else None)


def serve_sweep(run: ServeRun, prepared: ServePlan, progress: Progress | None = None) -> ServeResult:
    """Measure every level not measured yet, then summarise the whole run."""
    try:
        for strategy in run.strategies:
            measure_strategy(run, strategy, prepared.arguments.get(strategy), prepared.work, progress)
    except KeyboardInterrupt:
        raise Interrupted(run.path, "every level finished so far is kept") from None
    except Stopped as stop:
        run.note(f"{stop}: the run stopped")
        write_summary(run, summarise(run, prepared.arguments))
        raise
    result = summarise(run, prepared.arguments)
    write_summary(run, result)
    return result


def overall(run: ServeRun, progress: Progress) -> Progress:
    """`progress` told the requests of every level still to measure, where a level tells its own."""
    config = run.config
    total = sum(config.requests_at(level) for name in run.strategies for level in config.levels
                if run.measured(name, level) is None)
    ended = {"levels": 0, "level": 0}  # requests of the levels ended, of the level running

    def tick(strategy: str, level: Level, done: int, requests: int) -> None:
        if done == 0:
            ended["levels"] += ended["level"]
            ended["level"] = requests
        progress(strategy, level, ended["levels"] + done, total)

    return tick


def measure_strategy(run: ServeRun, strategy: str, engine_args: dict[str, Any] | None, work: Workload,
                     progress: Progress | None) -> None:
    """The strategy's levels not measured yet, on its endpoint or on a server started for them and stopped after."""
    config = run.config
    todo = [level for level in config.levels if run.measured(strategy, level) is None]
    if not todo:
        return
    if config.endpoints:
        url = config.endpoints[strategy]
        for level in todo:
            if not measure_level(run, strategy, url, level, work, config, None, progress):
                return
        return
    server = Server(strategy, engine_args, run.log_file(strategy), config.start_timeout)
    try:
        server.start()
    except SpecbenchError as exc:
        run.note(f"{strategy}: not measured: {exc}")
        return
    try:
        for level in todo:
            if not measure_level(run, strategy, server.url, level, work, config, server, progress):
                return
    finally:
        server.stop()


def load_target_for(plan: RunPlan):
    """The target the plan names, loaded where it says: what a drafter's conversion to vLLM's layout reads."""
    from specbench.decoding.target import load_target, resolve_device, resolve_dtype

    device = resolve_device(plan.config.device)
    return load_target(plan.config.model, device, resolve_dtype(plan.config.dtype, device))


def summarise(run: ServeRun, arguments: dict[str, dict[str, Any]] | None = None) -> ServeResult:
    """Every measured level against `ar`'s at the same level; crossovers, capacities and (from the servers'
    `arguments`) the schedules."""
    config, saved = run.load, run.meta["config"]["run"]
    levels, incomplete = [], []
    measured = {(s, lv.key): run.level_data(s, lv) for s in run.strategies for lv in config.levels}
    for level in config.levels:
        base = measured[(BASELINE, level.key)] if BASELINE in run.strategies else None
        for strategy in run.strategies:
            data = measured[(strategy, level.key)]
            if data is None or not data.complete:
                incomplete.append(f"{strategy} {level.key}")
            if data is not None:
                levels.append(level_entry(data, level, base, config, saved["seed"], saved["temperature"] == 0))
    result = ServeResult(run.path, levels, notes=list(run.meta["notes"]), complete=not incomplete, slo=config.slo,
                         incomplete=incomplete)
    for strategy in run.strategies:
        if strategy == BASELINE:
            continue
        own = [e for e in levels if e.strategy == strategy and e.concurrency is not None]
        failed = {e.level: e.errors + (e.baseline_errors or 0) for e in levels
                  if e.strategy == strategy and e.errors + (e.baseline_errors or 0)}
        # a level where a request failed, its own or ar's, gives no verdict; nor does one whose speedup's 95%
        # interval holds 1: its requests were too few to tell paying from not
        verdicts = [(e.concurrency, None if e.level in failed else schedule.speedup_verdict(e.tpot_speedup_ci))
                    for e in own]
        undecided = [e.level for e, (_, verdict) in zip(own, verdicts)
                     if verdict is None and e.level not in failed and e.tpot_speedup is not None]
        verdict = capacity(own, config.slo_share) if config.slo else ServeVerdict()
        result.strategies[strategy] = replace(verdict, crossover=schedule.crossover(verdicts), errors=failed,
                                              undecided=undecided)
        spec = (arguments or {}).get(strategy, {}).get("speculative_config")
        if spec and own and not failed:
            until = schedule.paying_until(verdicts)  # speculate only where it was shown to pay
            result.schedules[strategy] = schedule.vllm_schedule(spec, None if until is None else int(until))
    ar_levels = [e for e in levels if e.strategy == BASELINE and e.concurrency is not None]
    if config.slo and ar_levels:
        result.strategies[BASELINE] = capacity(ar_levels, config.slo_share)
    return result


def level_entry(data: LevelFile, level: Level, base: LevelFile | None, load: ServeLoad, seed: int,
                greedy: bool) -> ServeLevel:
    """One strategy's level in the summary: its figures (the `load`'s SLO and percentiles) and, beside `ar`'s
    level, the comparison with it and (greedy) the lossless check."""
    key = LevelKey(strategy=data.strategy, level=level.key, concurrency=level.concurrency,
                   request_rate=level.request_rate, complete=data.complete, stopped_by_time=data.stopped_by_time)
    more = tuple(load.percentiles)
    figures = level_summary(data.records, data.duration_s, load.slo, more=more)
    entry = ServeLevel(**vars(key), **vars(figures), speculation=data.speculation)
    if base is None or data.strategy == BASELINE:
        return entry
    base_figures = level_summary(base.records, base.duration_s, load.slo, more=more)
    versus = against_baseline(data.records, base.records, figures, base_figures, seed)
    lossless = greedy_agreement(data.records, base.records) if greedy else None
    return replace(entry, baseline_errors=base_figures.errors, lossless=lossless, **vars(versus))


def capacity(own: list[ServeLevel], share: float) -> ServeVerdict:
    """A strategy's capacity at the SLO over its closed-loop levels, and the levels too small to decide it."""
    verdicts = [(e.concurrency, None if e.errors else schedule.share_verdict(e.slo_met_ci, share)) for e in own]
    undecided = [e.level for e, (_, met) in zip(own, verdicts) if met is None and not e.errors]
    return ServeVerdict(capacity=schedule.capacity(verdicts), slo_share=share, capacity_undecided=undecided)


def write_summary(run: ServeRun, result: ServeResult) -> None:
    """summary.json and summary.csv, schedule.json and the plots; serve.json's status."""
    from specbench.report.serve_plots import write_serve_plots
    from specbench.report.serve_tables import levels_csv

    write_json(run.path / "summary.json", result.as_json())
    write_atomic(run.path / "summary.csv", levels_csv(result.levels))
    if result.schedules:
        write_json(run.path / "schedule.json", result.schedules)
    write_serve_plots(result, run.path / "plots")
    run.finish(result.complete)


def read_result(path: Path) -> ServeResult:
    """A serve run's result as summarised so far (its levels against ar's), read without writing anything; the
    schedules are those of its summary.json."""
    run = ServeRun.open(path)
    result = summarise(run)
    saved = run.path / "summary.json"
    if saved.is_file():
        schedules = ServeResult.from_json(read_json(saved, "serve summary"), str(saved)).schedules
        result.schedules = {name: s for name, s in schedules.items() if name in result.strategies}
    return result
