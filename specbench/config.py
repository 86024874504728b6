"""The resolved configuration of a run: defaults < TOML config file < command-line flags."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.errors import SpecbenchError


@dataclass
class RunConfig:
    model: str | None = None  # HF id, local directory, or None for the embedded default
    drafters: list[str] = field(default_factory=list)  # drafter directories
    strategies: list[str] = field(default_factory=lambda: ["default"])
    suite: str = "default"
    categories: list[str] = field(default_factory=list)
    limit: int | None = 8  # prompts, spread over the categories; 0 or None: the whole suite
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    warmup: int = 1
    repeats: int = 1
    out: str = "results"
    controller: str | None = None
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # strategy -> knob -> value
    gpu: str | None = None
    profiles: str | None = None  # TOML file with extra GPU profiles
    cost_model: bool = True  # time the forwards the cost model predicts from (stored, reused by later runs)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # each runs in turn; prompts decoded B at a time
    # strategy -> {"batch_sizes": [...], "draft_tokens": [...]}: at most that many drafts per step from each
    # listed batch size on (vLLM's num_speculative_tokens_per_batch_size; 0 = plain decoding)
    draft_schedule: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def validate(self) -> RunConfig:
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise SpecbenchError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SpecbenchError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecbenchError(f"--top-k must be >= 0, got {self.top_k}")
        if self.limit is not None and self.limit < 0:
            raise SpecbenchError(f"--limit must be 0 (the whole suite) or more, got {self.limit}")
        if self.limit == 0:
            self.limit = None
        if self.warmup < 0 or self.repeats < 1:
            raise SpecbenchError("--warmup must be >= 0 and --repeats at least 1")
        check_sizes(self.batch_sizes, "--batch-sizes")
        for strategy, entry in self.draft_schedule.items():
            check_draft_schedule(strategy, entry)
        return self


def check_sizes(values: tuple[int, ...] | list[int], option: str, low: int = 1) -> None:
    """A list of sizes must name at least one, each at least `low`, in increasing order without repeats."""
    if not values:
        raise SpecbenchError(f"{option} names no size; give a comma list such as 1,4,16")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < low for v in values):
        raise SpecbenchError(f"{option} {','.join(map(str, values))}: every size must be an integer of at least {low}")
    if list(values) != sorted(set(values)):
        raise SpecbenchError(f"{option} {','.join(map(str, values))}: list the sizes in increasing order, "
                             "each once")


def check_draft_schedule(strategy: str, entry: Any) -> None:
    where = f"draft_schedule.{strategy}"
    if not isinstance(entry, dict) or set(entry) != {"batch_sizes", "draft_tokens"}:
        raise SpecbenchError(f"{where} must hold exactly batch_sizes = [...] and draft_tokens = [...]")
    check_sizes(entry["batch_sizes"], f"{where}.batch_sizes")
    tokens = entry["draft_tokens"]
    if (not isinstance(tokens, list) or len(tokens) != len(entry["batch_sizes"])
            or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in tokens)):
        raise SpecbenchError(f"{where}.draft_tokens must hold one integer >= 0 per batch size")


FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
ALIASES = {"strategy": "strategies", "drafter": "drafters", "category": "categories"}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML run config: top-level keys are RunConfig fields; [knobs.STRATEGY] tables hold knobs."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecbenchError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecbenchError(f"config file {path}: {exc}") from None
    values = {}
    for key, value in raw.items():
        name = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in FIELDS:
            raise SpecbenchError(f"config file {path}: unknown key {key!r}; known: {', '.join(sorted(FIELDS))}")
        if name in ("strategies", "drafters", "categories") and isinstance(value, str):
            value = [value]
        values[name] = value
    return values


def resolve(file_values: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Defaults, then the config file, then every flag that was given (None means not given)."""
    merged = dict(file_values)
    knobs = {k: dict(v) for k, v in merged.pop("knobs", {}).items()}
    for strategy, values in flags.pop("knobs", {}).items():
        knobs.setdefault(strategy, {}).update(values)
    merged.update({k: v for k, v in flags.items() if v is not None and v != []})
    try:
        return RunConfig(knobs=knobs, **merged).validate()
    except TypeError as exc:
        raise SpecbenchError(f"bad configuration: {exc}") from None
