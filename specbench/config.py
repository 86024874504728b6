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
        return self


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
