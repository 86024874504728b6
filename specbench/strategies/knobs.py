"""Strategy knobs: `--set NAME.KNOB=VALUE` and TOML `[knobs.NAME]` values turned into each method's
knob dataclass, with one clear line for a knob that does not exist or a value of the wrong type."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from specbench.errors import SpecbenchError
from specbench.strategies.registry import DRAFTER_NAMES, definition


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """`--set draft.k=4` -> {"draft": {"k": "4"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        strategy, dot, knob = key.strip().partition(".")
        if not sep or not dot or not knob:
            raise SpecbenchError(f"--set {item}: expected STRATEGY.KNOB=VALUE, e.g. draft.k=4")
        if strategy not in DRAFTER_NAMES:
            raise SpecbenchError(f"--set {item}: unknown strategy {strategy!r}")
        out.setdefault(strategy, {})[knob] = value.strip()
    return out


def _coerce(value: str, kind: type, where: str) -> Any:
    try:
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        return kind(value)
    except ValueError:
        raise SpecbenchError(f"{where}: expected {kind.__name__}, got {value!r}") from None


def make_options(name: str, values: dict[str, Any]) -> Any:
    """Build a strategy's knob dataclass from config/CLI values; unknown knobs list the valid ones."""
    cls = definition(name).options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise SpecbenchError(f"unknown knob {name}.{key}; valid: {', '.join(f'{name}.{k}' for k in fields)}")
        kwargs[key] = _coerce(value, hints[key], f"{name}.{key}") if isinstance(value, str) else value
    return cls(**kwargs)


def validate_knobs(knobs: dict[str, dict[str, Any]]) -> None:
    """Check every knob of every strategy before anything is loaded."""
    for name, values in knobs.items():
        if name not in DRAFTER_NAMES:
            raise SpecbenchError(f"knobs for unknown strategy {name!r}; known: {', '.join(DRAFTER_NAMES)}")
        make_options(name, values)
