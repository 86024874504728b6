"""Knobs described as data: what each knob means, its unit and valid range, and the search space tune explores.

A knob dataclass declares every field with `knob(...)`, which keeps the description, unit and valid
range in the field's metadata (printed by `specbench strategies`, checked by `check_ranges`). Beside
it, a method declares its `SearchSpace`: a tuple of `Param`s, each an integer or float range (linear
or log) or a choice, optionally conditioned on an earlier parameter (`When`), with bounds that may
name an earlier parameter (`Ref`, so k_max is sampled from [k_min, 8] and no trial is infeasible) or
a limit of the loaded drafter (such as the MTP modules it was trained with). Spaces are frozen
dataclasses: printable, comparable and hashed into a study's identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Union

from specbench.core.errors import SpecbenchError

_KNOB = "specbench_knob"


@dataclass(frozen=True)
class KnobInfo:
    """What a person needs to set a knob: its meaning, unit and valid (inclusive) range."""

    description: str
    unit: str = ""
    low: float | None = None
    high: float | None = None
    architecture: bool = False  # fixed when the drafter is trained (its shape or its loss): never searched
    above: bool = False  # the value must exceed `low` (not merely reach it)

    def valid_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g}..{self.high:g}"
        if self.low is not None:
            return f"{'>' if self.above else '>='} {self.low:g}"
        return f"<= {self.high:g}" if self.high is not None else "any"


def knob(default: Any, description: str, unit: str = "", low: float | None = None, high: float | None = None,
         architecture: bool = False, above: bool = False) -> Any:
    """A knob dataclass field with its default and description (a `dataclasses.field`)."""
    return field(default=default, metadata={_KNOB: KnobInfo(description, unit, low, high, architecture, above)})


def knob_infos(options: Any) -> dict[str, KnobInfo]:
    """Field name -> KnobInfo of a knob dataclass (class or instance), in declaration order."""
    return {f.name: f.metadata[_KNOB] for f in dataclasses.fields(options) if _KNOB in f.metadata}


def check_ranges(options: Any, prefix: str) -> None:
    """Refuse the first knob outside its declared valid range, naming it (`prefix` e.g. "dspark.")."""
    for name, info in knob_infos(options).items():
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        # written as `not in range` so that NaN is refused too
        too_low = info.low is not None and not (value > info.low if info.above else value >= info.low)
        if too_low or (info.high is not None and not value <= info.high):
            bounds = (f"between {info.low:g} and {info.high:g}" if info.low is not None and info.high is not None
                      else f"{'above' if info.above else 'at least'} {info.low:g}" if info.low is not None
                      else f"at most {info.high:g}")
            raise SpecbenchError(f"{prefix}{name} must be {bounds}, got {value}")


@dataclass(frozen=True)
class Ref:
    """A bound taken from an earlier parameter's value (or a drafter limit), plus an offset."""

    name: str
    plus: float = 0

    def __str__(self) -> str:
        return self.name + (f"{self.plus:+g}" if self.plus else "")


Bound = Union[int, float, Ref]


def _bound(bound: Bound, values: dict[str, Any]) -> float:
    if not isinstance(bound, Ref):
        return bound
    if bound.name not in values:
        raise SpecbenchError(f"search space bound {bound} names nothing sampled before it")
    return values[bound.name] + bound.plus


def _substitute(bound: Bound, name: str, value: Any) -> Bound:
    return value + bound.plus if isinstance(bound, Ref) and bound.name == name else bound


def _rename(bound: Bound, prefix: str) -> Bound:
    return replace(bound, name=prefix + bound.name) if isinstance(bound, Ref) else bound


def _text(bound: Bound) -> str:
    return str(bound) if isinstance(bound, Ref) else f"{bound:g}"


@dataclass(frozen=True)
class IntRange:
    low: Bound
    high: Bound
    log: bool = False
    step: int = 1

    def suggest(self, trial, name: str, values: dict[str, Any]) -> int:
        low, high = int(_bound(self.low, values)), int(_bound(self.high, values))
        return trial.suggest_int(name, low, high, log=self.log, step=self.step)

    def contains(self, value: Any, values: dict[str, Any]) -> bool:
        low = _bound(self.low, values)
        return (isinstance(value, int) and low <= value <= _bound(self.high, values)
                and (value - low) % self.step == 0)

    def describe(self) -> str:
        return (f"{_text(self.low)}..{_text(self.high)}" + (" log" if self.log else "")
                + (f" step {self.step}" if self.step != 1 else ""))


@dataclass(frozen=True)
class FloatRange:
    low: Bound
    high: Bound
    log: bool = False

    def suggest(self, trial, name: str, values: dict[str, Any]) -> float:
        return trial.suggest_float(name, _bound(self.low, values), _bound(self.high, values), log=self.log)

    def contains(self, value: Any, values: dict[str, Any]) -> bool:
        return isinstance(value, (int, float)) and _bound(self.low, values) <= value <= _bound(self.high, values)

    def describe(self) -> str:
        return f"{_text(self.low)}..{_text(self.high)}" + (" log" if self.log else "")


@dataclass(frozen=True)
class Choice:
    values: tuple

    def suggest(self, trial, name: str, values: dict[str, Any]) -> Any:
        return trial.suggest_categorical(name, self.values)

    def contains(self, value: Any, values: dict[str, Any]) -> bool:
        return value in self.values

    def describe(self) -> str:
        return " | ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in self.values)


Domain = Union[IntRange, FloatRange, Choice]


@dataclass(frozen=True)
class When:
    """Search a parameter only when an earlier one took one of `values`."""

    name: str
    values: tuple

    def holds(self, values: dict[str, Any]) -> bool:
        return self.name in values and values[self.name] in self.values


@dataclass(frozen=True)
class Param:
    name: str
    domain: Domain
    when: When | None = None

    def describe(self) -> str:
        condition = f" if {self.when.name} = {' | '.join(map(str, self.when.values))}" if self.when else ""
        return self.domain.describe() + condition


@dataclass(frozen=True)
class SearchSpace:
    """Parameters sampled in order: conditions and dependent bounds refer to earlier parameters."""

    params: tuple[Param, ...] = ()

    def __add__(self, other: SearchSpace) -> SearchSpace:
        return SearchSpace(self.params + other.params)

    def __bool__(self) -> bool:
        return bool(self.params)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def active(self, values: dict[str, Any]) -> list[Param]:
        return [p for p in self.params if p.when is None or p.when.holds(values)]

    def suggest(self, trial) -> dict[str, Any]:
        """One point from an Optuna trial: every parameter whose condition holds, in declaration order."""
        values: dict[str, Any] = {}
        for p in self.params:
            if p.when is None or p.when.holds(values):
                values[p.name] = p.domain.suggest(trial, p.name, values)
        return values

    def point(self, source: dict[str, Any]) -> dict[str, Any]:
        """The point that takes each active parameter's value from `source` (e.g. the defaults); every
        value must lie in its range, so that Optuna runs it as given rather than sampling another."""
        values: dict[str, Any] = {}
        for p in self.params:
            if p.when is not None and not p.when.holds(values):
                continue
            value = source[p.name]
            if not p.domain.contains(value, values):
                raise SpecbenchError(f"{p.name}={value!r} is outside its search range {p.describe()}")
            values[p.name] = value
        return values

    def fix(self, name: str, value: Any) -> SearchSpace:
        """The space with `name` held at `value`: bounds that name it become numbers, parameters whose
        condition it fails (and those conditioned on them) are dropped, the others lose the condition."""
        kept: list[Param] = []
        dropped = {name}
        for p in self.params:
            if p.name == name:
                continue
            when = p.when
            if when is not None and when.name in dropped:
                if when.name != name or value not in when.values:
                    dropped.add(p.name)
                    continue
                when = None
            domain = p.domain
            if isinstance(domain, (IntRange, FloatRange)):
                domain = replace(domain, low=_substitute(domain.low, name, value),
                                 high=_substitute(domain.high, name, value))
            kept.append(Param(p.name, domain, when))
        return SearchSpace(tuple(kept))

    def prefixed(self, prefix: str) -> SearchSpace:
        """Every name (and every reference to one) with `prefix`, for a member of a combination."""
        out = []
        for p in self.params:
            domain = p.domain
            if isinstance(domain, (IntRange, FloatRange)):
                domain = replace(domain, low=_rename(domain.low, prefix), high=_rename(domain.high, prefix))
            when = replace(p.when, name=prefix + p.when.name) if p.when else None
            out.append(Param(prefix + p.name, domain, when))
        return SearchSpace(tuple(out))

    def fingerprint(self) -> str:
        """A short stable hash: two studies with the same space have the same one."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, str]:
        return {p.name: p.describe() for p in self.params}
