"""`specbench serve`: every strategy against plain decoding on real servers, at a sweep of loads."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.backends.registry import parse_engine_args
from specbench.backends.vllm import VLLM
from specbench.cli import options
from specbench.cli.app import app, err, interruptible, out, progress_bar, size_list, split_list, user_errors
from specbench.config import RunConfig
from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError
from specbench.serving.config import SERVE_STRATEGIES, ServeConfig, parse_endpoints, parse_rates, parse_slo
from specbench.strategies.knobs import parse_sets


@app.command()
def serve(
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Strategies vLLM runs, each on a server of its own (repeatable or comma list); ar is always measured.", show_default=",".join(SERVE_STRATEGIES))] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="Closed-loop levels: N clients, each sending its next request when its last is answered (comma list, increasing).", show_default="1,4,16 without --request-rate")] = None,
    request_rate: Annotated[Optional[str], typer.Option("--request-rate", help="Open-loop levels: requests per second, Poisson arrivals (comma list, increasing).", show_default="none")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help="Open loop: requests in flight at most.", show_default="no cap")] = None,
    burstiness: Annotated[Optional[float], typer.Option("--burstiness", help="Open loop: gamma shape of the arrival gaps (1: Poisson; below 1: burstier).", show_default="1")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Measured requests per level, each a prompt of its own.", show_default="4 per client, at least 8")] = None,
    repeat_prompts: Annotated[bool, typer.Option("--repeat-prompts", help="Let a level's requests repeat prompts when there are fewer than its requests (never the warm-up's prompts).")] = False,
    input_len: Annotated[Optional[int], typer.Option("--input-len", help="Synthetic prompts of this many random tokens (no chat template) instead of the suite's.", show_default="the suite's prompts")] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", help="Every answer exactly this many tokens (ignore EOS), for runs comparable with vllm bench serve.", show_default="up to --max-new-tokens")] = None,
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Unmeasured requests at each level's load before it.", show_default="2")] = None,
    level_seconds: Annotated[Optional[float], typer.Option("--level-seconds", help="A level sends no new request after this many seconds.", show_default="600")] = None,
    request_timeout: Annotated[Optional[float], typer.Option("--request-timeout", help="Seconds a request may take, its streamed answer included; one past it fails and leaves its level incomplete.", show_default="the level's time and 10 minutes")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", help="Latency targets in ms, e.g. ttft=500,tpot=50,e2e=5000: goodput counts the requests meeting all; capacity is the highest concurrency where --slo-share of the requests meet all.", show_default="none")] = None,
    slo_share: Annotated[Optional[float], typer.Option("--slo-share", help="Capacity: the share of a level's requests that must meet every --slo target, decided by its 95% interval.", show_default="0.99")] = None,
    endpoint: Annotated[Optional[list[str]], typer.Option("--endpoint", help="NAME=URL of a running OpenAI-compatible server to measure instead of starting one (repeatable; name one `ar` for the ratios).", show_default="none")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="--endpoint: the served model's tokenizer (a local directory or a cached hub id); checked against the server's /tokenize.", show_default="--model's, else the model the server lists when found locally")] = None,
    endpoint_type: Annotated[Optional[str], typer.Option("--endpoint-type", help="completions (prompts as token ids) or chat (the user's turn as text; the server applies its template).", show_default="completions")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, help="--endpoint: the servers' API key, sent as a bearer token on every request.", show_default="none")] = None,
    header: Annotated[Optional[list[str]], typer.Option("--header", help="--endpoint: NAME:VALUE sent on every request (repeatable).", show_default="none")] = None,
    model: options.Model = None,
    drafter: options.Drafters = None,
    suite: options.Suite = None,
    categories: options.Categories = None,
    limit: options.Limit = None,
    max_new_tokens: options.MaxNewTokens = None,
    temperature: options.Temperature = None,
    seed: options.Seed = None,
    dtype: options.Dtype = None,
    device: options.Device = None,
    set_: options.Knobs = None,
    engine_args: options.EngineArgs = None,
    out_dir: options.ResultsDir = None,
    resume: Annotated[Optional[Path], typer.Option(help="Measure the levels an interrupted serve run has not finished.", show_default="none")] = None,
    as_json: options.Json = False,
) -> None:
    """Measure strategies on real vLLM servers (or running endpoints) at a sweep of loads."""
    with user_errors():
        from specbench.serving.run_dir import ServeRun

        flags = dict(strategy=strategy, concurrency=concurrency, request_rate=request_rate,
                     max_concurrency=max_concurrency, burstiness=burstiness, requests=requests, warmup=warmup,
                     level_seconds=level_seconds, request_timeout=request_timeout, slo=slo, slo_share=slo_share,
                     endpoint=endpoint,
                     model=model, drafter=drafter, suite=suite, categories=categories, limit=limit,
                     max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype, device=device,
                     set=set_, engine_args=engine_args, out=out_dir, tokenizer=tokenizer, endpoint_type=endpoint_type,
                     repeat_prompts=repeat_prompts or None, input_len=input_len, output_len=output_len)
        if resume is not None:
            given = sorted(name for name, value in flags.items() if value is not None)
            if given:
                raise SpecbenchError(f"--resume continues a serve run with its saved configuration; drop "
                                     f"{', '.join('--' + name.replace('_', '-') for name in given)}")
            run = ServeRun.resume(resume)
            run.headers = endpoint_headers(run.config, api_key, header)
            config = run.config.validate()
        else:
            run = None
            config = serve_config(**flags)
            config.headers = endpoint_headers(config, api_key, header)

        from specbench.serving.sweep import plan, serve_sweep, strategy_names

        def how_to_resume(stop) -> str:
            return f"resume it with: specbench serve --resume {shlex.quote(str(stop.path))}"

        before = (f"interrupted before anything new was measured; {how_to_resume(run)}" if run else
                  "interrupted before anything was measured")
        with interruptible(how_to_resume, before), progress_bar() as bar:
            prepared = plan(config)  # drafters converted, prompts encoded: before the run directory exists
            if run is None:
                run = ServeRun.create(config, strategy_names(config), config.run.model or "the embedded model",
                                      config.run.suite)
                for note in prepared.notes:
                    run.note(note)
            todo = sum(config.requests_at(level) for name in run.strategies for level in config.levels
                       if run.measured(name, level) is None)
            task = bar.add_task("starting", total=todo, detail="requests")
            finished = {"before": 0, "level": 0}  # requests of the levels ended, of the level running

            def progress(name: str, level, done: int, total: int) -> None:
                if done == 0:
                    finished["before"] += finished["level"]
                    finished["level"] = total
                bar.update(task, description=f"{name} {level.label}", completed=finished["before"] + done)

            result = serve_sweep(run, prepared, progress)
        print_result(result, as_json)


def endpoint_headers(config: ServeConfig, api_key: str | None, header: list[str] | None) -> dict[str, str]:
    """The headers of every request to the --endpoint servers (none for the servers specbench starts)."""
    from specbench.serving.endpoint import parse_headers, request_headers

    if not config.endpoints:
        if header:
            raise SpecbenchError("--header is sent to --endpoint servers; the servers specbench starts need none")
        return {}
    return request_headers(api_key, parse_headers(header))


def serve_config(strategy, concurrency, request_rate, max_concurrency, burstiness, requests, warmup, level_seconds,
                 request_timeout, slo, slo_share, endpoint, model, drafter, suite, categories, limit, max_new_tokens,
                 temperature, seed, dtype, device, set, engine_args, out, tokenizer, endpoint_type, repeat_prompts,
                 input_len, output_len) -> ServeConfig:
    """The command line as a checked ServeConfig: every bad input refused here, before anything is written."""
    endpoints = parse_endpoints(endpoint)
    if endpoints and (strategy or drafter or set):
        raise SpecbenchError("--endpoint measures servers as they run: --strategy, --drafter and --set configure the "
                             "servers specbench starts; drop them")
    if output_len is not None and max_new_tokens is not None:
        raise SpecbenchError("--output-len fixes every answer's length; drop --max-new-tokens")
    rates = parse_rates(request_rate)
    levels = size_list(concurrency, "--concurrency")
    run_values = dict(model=model, drafters=[str(d) for d in drafter or []], suite=suite,
                      categories=split_list(categories), limit=limit, max_new_tokens=max_new_tokens,
                      temperature=temperature, seed=seed, dtype=dtype, device=device, out=out,
                      engine_args=parse_engine_args(engine_args), knobs=parse_sets(set or []),
                      strategies=["ar"] if endpoints else split_list(strategy) or SERVE_STRATEGIES,
                      engine=SPECBENCH if endpoints else VLLM)
    run = RunConfig(**{k: v for k, v in run_values.items() if v is not None and v != []})
    serve_values = dict(max_concurrency=max_concurrency, burstiness=burstiness, requests=requests, warmup=warmup,
                        level_seconds=level_seconds, request_timeout=request_timeout, slo_share=slo_share,
                        tokenizer=tokenizer, endpoint_type=endpoint_type, repeat_prompts=repeat_prompts,
                        input_len=input_len,
                        output_len=output_len)
    config = ServeConfig(run=run, concurrency=list(levels) if levels is not None else ([] if rates else [1, 4, 16]),
                         request_rates=rates, slo=parse_slo(slo), endpoints=endpoints,
                         **{k: v for k, v in serve_values.items() if v is not None})
    if limit is None and input_len is None and config.levels:  # as many of the suite's prompts as the levels' distinct requests need
        config.run.limit = config.prompts_needed
    config = config.validate()
    if slo_share is not None and not slo:  # after the ranges, so an out-of-range share is named as such
        raise SpecbenchError("--slo-share is the share of requests that must meet --slo: give --slo too")
    return config


def print_result(result, as_json: bool) -> None:
    """The result's notes, then its JSON or a table per level with the decisions under them."""
    from specbench.core.strict_json import dumps
    from specbench.output.serve_tables import LEGEND, decisions, level_tables

    for note in result.notes:
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    if as_json:
        sys.stdout.write(dumps(result.as_json(), indent=2) + "\n")
    else:
        for table in level_tables(result.levels, bool(result.slo)):
            out.print(table)
        out.print(LEGEND, style="dim", highlight=False)
        for line in decisions(result.strategies, result.levels):
            out.print(line, highlight=False, style="bold red" if line.startswith("LOSSLESS") else None)
    if not result.complete:
        err.print(f"incomplete: resume it with: specbench serve --resume {shlex.quote(str(result.path))}",
                  highlight=False, soft_wrap=True)
    err.print(f"results: {result.path}", highlight=False)
