"""Strategy knobs: `--set NAME.KNOB=VALUE` and TOML `[knobs.NAME]` values turned into each method's
knob dataclass, with one clear line for a knob that does not exist, a value of the wrong type, or
a knob for a strategy the run does not include. `combine.*` (methods/combine_options.py) are the
knobs of how a combination combines, for runs that include one.

`parse_sets` and `check_knobs_apply` are torch-free; `make_options` imports the method's module.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any

from specbench.core.errors import SpecbenchError
from specbench.methods.combine_options import COMBINE, CombineOptions
from specbench.methods.registry import DRAFTER_NAMES, definition

if TYPE_CHECKING:
    from specbench.methods.names import StrategyName


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """`--set draft.k=4` -> {"draft": {"k": "4"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        strategy, dot, knob = key.strip().partition(".")
        if not sep or not dot or not knob:
            raise SpecbenchError(f"--set {item}: expected STRATEGY.KNOB=VALUE, e.g. draft.k=4")
        if strategy not in DRAFTER_NAMES + (COMBINE,):
            raise SpecbenchError(f"--set {item}: unknown strategy {strategy!r}")
        out.setdefault(strategy, {})[knob] = value.strip()
    return out


def check_knobs_apply(knobs: dict[str, dict[str, Any]], specs: list[StrategyName]) -> None:
    """Knobs only for strategies the run includes (alone or in a combination): others would go unused."""
    run = {member for spec in specs for member in spec.members}
    if any(len(spec.members) > 1 for spec in specs):
        run.add(COMBINE)
    for name, values in knobs.items():
        if name not in DRAFTER_NAMES + (COMBINE,):
            raise SpecbenchError(f"knobs for unknown strategy {name!r}; known: {', '.join(DRAFTER_NAMES)}")
        if values and name not in run:
            given = ", ".join(f"{name}.{knob}" for knob in values)
            what, add = ("a combination", "a combination such as eagle+suffix") if name == COMBINE else (name, name)
            raise SpecbenchError(f"knob {given} is for {what}, which this run does not include "
                                 f"({', '.join(s.name for s in specs)}); add {add} to --strategy or drop the knob")


def _coerce(value: Any, kind: type, where: str) -> Any:
    """A `--set` string parsed as the knob's type; a TOML value checked against it (an int is a float)."""
    if isinstance(value, str) and kind is not str:
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return kind(value)
        except ValueError:
            raise SpecbenchError(f"{where}: expected {kind.__name__}, got {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # a str knob may also take a list (mtp.branching = [3, 2]); its dataclass joins it
    fits = isinstance(value, (str, list, tuple)) if kind is str else isinstance(value, kind)
    if not fits or (isinstance(value, bool) and kind is not bool):
        raise SpecbenchError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def make_options(name: str, values: dict[str, Any]) -> Any:
    """Build a strategy's knob dataclass from config/CLI values; unknown knobs list the valid ones."""
    cls = CombineOptions if name == COMBINE else definition(name).options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise SpecbenchError(f"unknown knob {name}.{key}; valid: {', '.join(f'{name}.{k}' for k in fields)}")
        kwargs[key] = _coerce(value, hints[key], f"{name}.{key}")
    return cls(**kwargs)


def validate_knobs(knobs: dict[str, dict[str, Any]]) -> None:
    """Check every knob of every strategy before anything is loaded."""
    for name, values in knobs.items():
        if name not in DRAFTER_NAMES + (COMBINE,):
            raise SpecbenchError(f"knobs for unknown strategy {name!r}; known: {', '.join(DRAFTER_NAMES)}")
        make_options(name, values)
