"""What a serve run measures, checked before any server starts: the load levels, the SLO, the endpoints.

Torch-free, so bad input (a level of 0, an SLO that does not parse, a URL that is not http(s)) is
refused at once and nothing is written. The prompts, the target, the strategies and their knobs are
a RunConfig's, checked and resolved once into the `RunPlan` a `ServeConfig` holds.
"""

from __future__ import annotations

import math
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlparse

from specbench.core.engine_names import SPECBENCH
from specbench.core.errors import SpecbenchError
from specbench.core.ranges import check_ranges, check_sizes
from specbench.engines.vllm import VLLM
from specbench.methods.names import BASELINE
from specbench.methods.registry import SERVED
from specbench.plan.run_config import RunConfig, RunPlan
from specbench.plan.sharegpt import dataset_path
from specbench.serving.endpoint import chosen_key, request_headers, shown_url

SLO_KEYS = ("ttft", "tpot", "e2e")  # milliseconds each
MIN_LEVEL_REQUESTS = 8  # measured requests of a level without --requests, at least four per client above two
SERVE_STRATEGIES = list(SERVED)
DEFAULT_CONCURRENCY = [1, 4, 16]  # closed-loop levels without --concurrency or --request-rate
ENDPOINT_TYPES = ("completions", "chat")  # /v1/completions with token ids, /v1/chat/completions with the turn's text


@dataclass(frozen=True)
class Level:
    """One load: a closed loop of `concurrency` clients, or Poisson arrivals at `request_rate` per second."""

    concurrency: int | None = None
    request_rate: float | None = None

    @property
    def key(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.request_rate:g}"

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"{self.request_rate:g} req/s"

    @property
    def x(self) -> float:
        """Where the level sits on a load axis."""
        return float(self.concurrency if self.concurrency is not None else self.request_rate)


@dataclass(frozen=True)
class ServeLoad:
    """A serve run's load and how its requests are sent."""

    concurrency: list[int] = field(default_factory=list)  # closed-loop levels
    request_rates: list[float] = field(default_factory=list)  # open-loop levels, requests per second
    max_concurrency: int | None = None  # open loop: requests in flight at most
    burstiness: float = 1.0  # gamma shape of the inter-arrival times; 1 is Poisson, below 1 burstier
    requests: int | None = None  # measured requests per level; None: 4 per client, at least MIN_LEVEL_REQUESTS
    warmup: int = 2  # unmeasured requests sent at the level's load before it
    level_seconds: float = 600.0  # a level sends no new request after this long
    start_timeout: float = 900.0  # seconds a server may take to become healthy
    request_timeout: float | None = None  # seconds a request may take, its stream included; None: the level's
    slo: dict[str, float] = field(default_factory=dict)  # ttft, tpot, e2e -> milliseconds
    slo_share: float = 0.99  # capacity: the share of a level's requests that must meet every SLO at once
    percentiles: list[float] = field(default_factory=list)  # latency percentiles beside p50/p90/p99 (summary, CSV)
    endpoints: dict[str, str] = field(default_factory=dict)  # name -> base URL of a running server
    tokenizer: str | None = None  # --endpoint: the served model's tokenizer (a directory or a cached hub id)
    endpoint_type: str = "completions"  # one of ENDPOINT_TYPES
    repeat_prompts: bool = False  # a level's measured requests may repeat prompts (never the warm-up's)
    input_len: int | None = None  # synthetic prompts of this many random tokens instead of the suite's
    dataset: str | None = None  # "sharegpt" or a file in ShareGPT's layout: its prompts instead of the suite's
    multi_turn: bool = False  # --dataset: every user turn with the conversation before it, not the first alone
    output_len: int | None = None  # every answer exactly this long (ignore_eos) instead of up to max_new_tokens
    range_ratio: float = 0.0  # input and output lengths drawn uniformly within (1 +- ratio) x their lengths
    prefix_len: int | None = None  # --input-len: a random prefix of this many tokens that every prompt shares
    # every request's headers (the API key's among them): credentials, never written to the run directory
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def levels(self) -> list[Level]:
        return [Level(concurrency=c) for c in self.concurrency] + [Level(request_rate=r) for r in self.request_rates]

    def requests_at(self, level: Level) -> int:
        """Measured requests of a level: --requests, else four per client and at least MIN_LEVEL_REQUESTS."""
        if self.requests is not None:
            return self.requests
        clients = level.concurrency or self.max_concurrency or 1
        return max(MIN_LEVEL_REQUESTS, 4 * clients)

    @property
    def prompts_needed(self) -> int:
        """Distinct prompts for the warm-up and the levels, each request its own: the largest level's where a
        server specbench starts empties its prefix cache before each level, every level's at --endpoint
        servers, whose caches are their own (each level then sends prompts no earlier level sent)."""
        sizes = [self.requests_at(level) for level in self.levels]
        return self.warmup + (sum(sizes) if self.endpoints else max(sizes))

    def first_prompt(self, level: Level) -> int:
        """The level's first measured prompt after the warm-up's: after every earlier level's at --endpoint
        servers, else the first."""
        if not self.endpoints:
            return 0
        return sum(self.requests_at(earlier) for earlier in self.levels[:self.levels.index(level)])

    def check_prompts(self, available: int) -> None:
        """Enough prompts for every level's requests to be distinct (or, with repeats, beside the warm-up's)."""
        if available >= self.prompts_needed or (self.repeat_prompts and available > self.warmup):
            return
        largest = max(self.levels, key=self.requests_at)
        levels = f"{'+'.join(str(self.requests_at(lv)) for lv in self.levels)} for the levels, each its own" \
            if self.endpoints else f"{self.requests_at(largest)} at {largest.label}"
        raise SpecbenchError(f"{available} prompts for {self.prompts_needed} distinct requests ({self.warmup} warm-up, "
                             f"{levels}): give a larger --suite or --limit, --input-len N (synthetic prompts), fewer "
                             "--requests, or --repeat-prompts")

    def validate(self, engine_args: dict[str, Any]) -> None:
        """The load checked, with the `engine_args` of the run it serves."""
        if not self.levels:
            raise SpecbenchError("give the load: --concurrency 1,4,16 (closed loop) or --request-rate 1,2,4 "
                                 "(open loop)")
        if self.concurrency:
            check_sizes(self.concurrency, "--concurrency")
        parse_rates(",".join(map(str, self.request_rates)) if self.request_rates else None)
        parse_percentiles(",".join(map(str, self.percentiles)) if self.percentiles else None)
        check_ranges({"--input-len": self.input_len, "--output-len": self.output_len,
                      "--max-concurrency": self.max_concurrency, "--burstiness": self.burstiness,
                      "--requests": self.requests, "--warmup": self.warmup, "--level-seconds": self.level_seconds,
                      "--request-timeout": self.request_timeout, "--slo-share": self.slo_share,
                      "--range-ratio": self.range_ratio, "--prefix-len": self.prefix_len})
        if self.range_ratio and self.input_len is None and self.output_len is None:
            raise SpecbenchError("--range-ratio spreads --input-len and --output-len: give either")
        if self.prefix_len is not None and self.input_len is None:
            raise SpecbenchError("--prefix-len is the shared start of synthetic prompts: give --input-len too")
        if "api_key" in engine_args:
            raise SpecbenchError("--engine-args api_key: the servers specbench starts listen on 127.0.0.1 alone and "
                                 "take no key (one given here would be saved with the run); drop it")
        if self.endpoints and engine_args:
            raise SpecbenchError("--engine-args configure the servers specbench starts; --endpoint servers are "
                                 "already running")
        if self.tokenizer is not None and not self.endpoints:
            raise SpecbenchError("--tokenizer names an --endpoint server's tokenizer; the servers specbench starts "
                                 "use --model's")
        if self.dataset is not None and self.input_len is not None:
            raise SpecbenchError("--dataset and --input-len each choose the prompts: give one")
        if self.multi_turn and self.dataset is None:
            raise SpecbenchError("--multi-turn replays a --dataset's conversations: give --dataset sharegpt or a file")
        if self.dataset is not None:
            dataset_path(self.dataset)
        if self.endpoint_type not in ENDPOINT_TYPES:
            raise SpecbenchError(f"--endpoint-type {self.endpoint_type}: expected one of {', '.join(ENDPOINT_TYPES)}")


@dataclass(frozen=True)
class ServeConfig(ServeLoad):
    """A serve run: its load, and the plan of the run it serves (the target, the prompts, the strategies and their
    knobs, the decoding settings, vLLM's engine arguments), resolved once."""

    plan: RunPlan = field(kw_only=True)

    @property
    def run(self) -> RunConfig:
        """The run's checked configuration, as the plan holds it."""
        return self.plan.config

    def as_json(self) -> dict[str, Any]:
        load = {f.name: getattr(self, f.name) for f in fields(ServeLoad) if f.name != "headers"}
        return {"run": asdict(self.run), **deepcopy(load)}

    @classmethod
    def from_json(cls, data: dict[str, Any], headers: dict[str, str]) -> ServeConfig:
        """A saved serve run's configuration, checked and planned again, sending `headers`."""
        load = ServeLoad(**{k: v for k, v in data.items() if k != "run"}, headers=headers)
        load.validate(data["run"]["engine_args"])
        return cls.planned(load, RunConfig(**data["run"]))

    @classmethod
    def planned(cls, load: ServeLoad, run: RunConfig) -> ServeConfig:
        """`load` serving `run`, planned (the load already checked)."""
        return cls(plan=run.plan("serve configuration"), **{f.name: getattr(load, f.name) for f in fields(load)})


def serve_config(run: dict[str, Any], api_key: str | None = None, **load: Any) -> ServeConfig:
    """A serve run's configuration, every bad input refused before anything is written: `run` the run's
    settings (RunConfig's fields, checked for their types), `load` ServeLoad's, `api_key` sent with the
    `headers` to the --endpoint servers.

    Its defaults, the command's and the library's: closed loops of DEFAULT_CONCURRENCY clients without a load;
    `ar` alone at --endpoint servers, else SERVE_STRATEGIES on vLLM; without a --limit (and without --input-len),
    as many of the suite's (or the --dataset's) prompts as the levels' distinct requests need."""
    endpoints = load.get("endpoints")
    if endpoints and any(run.get(name) for name in ("strategies", "drafters", "knobs")):
        raise SpecbenchError("--endpoint measures servers as they run: --strategy, --drafter and --set configure the "
                             "servers specbench starts; drop them")
    if load.get("dataset") is not None and any(run.get(name) for name in ("suite", "categories")):
        raise SpecbenchError("--dataset replaces the suite's prompts: drop --suite and --categories")
    if load.get("output_len") is not None and run.get("max_new_tokens") is not None:
        raise SpecbenchError("--output-len fixes every answer's length; drop --max-new-tokens")
    if load.get("concurrency") is None and load.get("request_rates") is None:
        load = {**load, "concurrency": list(DEFAULT_CONCURRENCY)}
    headers = load.pop("headers", {})
    checked = ServeLoad(**load)
    defaults = {"engine": SPECBENCH, "strategies": [BASELINE]} if endpoints else \
        {"engine": VLLM, "strategies": SERVE_STRATEGIES}
    config = RunConfig(**{**defaults, **run})
    checked.validate(config.engine_args)
    if run.get("limit") is None and checked.input_len is None:  # a prompt of its own for each request
        config = replace(config, limit=checked.prompts_needed)
    served = ServeConfig.planned(checked, config)
    if "slo_share" in load and not checked.slo:  # after the ranges, so an out-of-range share is named as such
        raise SpecbenchError("--slo-share is the share of requests that must meet --slo: give --slo too")
    return replace(served, headers=endpoint_headers(served.endpoints, api_key, headers))


def endpoint_headers(endpoints: dict[str, str], api_key: str | None, headers: dict[str, str]) -> dict[str, str]:
    """The headers of every request to the --endpoint servers (none for the servers specbench starts): `headers`
    and the key `chosen_key` picks."""
    if not endpoints:
        if headers:
            raise SpecbenchError("--header is sent to --endpoint servers; the servers specbench starts need none")
        return {}
    return request_headers(chosen_key(endpoints, api_key)[0], headers)


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft=200,tpot=50,e2e=2000` (milliseconds) -> {"ttft": 200.0, ...}."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if not sep or key not in SLO_KEYS or key in slo or not ms > 0 or ms == float("inf"):
            raise SpecbenchError(f"--slo {text}: expected {','.join(k + '=MS' for k in SLO_KEYS)} (any of them, "
                                 "each once, in milliseconds above 0), e.g. ttft=500,tpot=50")
        slo[key] = ms
    return slo


def parse_endpoints(values: list[str] | None) -> dict[str, str]:
    """`NAME=URL` (repeatable) -> {name: base URL}; the URL must be http(s) with a host, and without credentials
    or a query, which would be saved with the run and printed (they are refused without being shown)."""
    endpoints: dict[str, str] = {}
    for value in values or []:
        name, sep, url = value.partition("=")
        name, url = name.strip(), url.strip().rstrip("/")
        parsed = urlparse(url)
        shown = f"{name}={shown_url(url)}" if sep else shown_url(value) if "://" in value else value
        if not sep or not name or name in endpoints:
            raise SpecbenchError(f"--endpoint {shown}: expected NAME=URL, each name once, e.g. ar=http://127.0.0.1:8000")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise SpecbenchError(f"--endpoint {shown}: is not an http(s) URL such as http://127.0.0.1:8000")
        if parsed.username is not None or parsed.password is not None or parsed.query or parsed.fragment:
            raise SpecbenchError(f"--endpoint {shown}: credentials or a query inside the URL (not shown) would be "
                                 "saved with the run; give the key with --api-key or a header with --header")
        endpoints[name] = url.removesuffix("/v1")
    return endpoints


def numbers(text: str, error: str) -> list[float]:
    """A comma list of numbers; `error`, a SpecbenchError, where a part is not one."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SpecbenchError(error) from None


def parse_percentiles(text: str | None) -> list[float]:
    """`--percentiles 95,99.9` -> [95.0, 99.9], each above 0 and below 100."""
    if text is None:
        return []
    error = f"--percentiles {text}: expected a comma list of percentiles above 0 and below 100, e.g. 95,99.9"
    values = numbers(text, error)
    if not values or not all(0 < p < 100 for p in values):
        raise SpecbenchError(error)
    return sorted(set(values))


def parse_rates(text: str | None) -> list[float]:
    """`--request-rate 0.5,1,2` -> [0.5, 1.0, 2.0], increasing."""
    if text is None:
        return []
    rates = numbers(text, f"--request-rate {text}: expected a comma list of numbers such as 0.5,1,2")
    if not all(0 < rate < math.inf for rate in rates):
        raise SpecbenchError(f"--request-rate {text}: every rate must be a number of requests per second above 0")
    if not rates or rates != sorted(set(rates)):
        raise SpecbenchError(f"--request-rate {text}: list the rates in increasing order, each once")
    return rates
