"""Strategies: a drafter plus a controller, named on the command line (`eagle+dflash`, `ngram`, ...).

Each drafter module defines one `StrategyDef`; `REGISTRY` lists them. Adding a method means one
new module and one line here.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specbench.engine.protocol import Controller, Drafter
from specbench.errors import SpecbenchError
from specbench.strategies.base import StrategyDef
from specbench.strategies.combine import CombinedDrafter
from specbench.strategies.controllers import CONTROLLERS, FixedController

BASELINE = "ar"


def _registry() -> dict[str, StrategyDef]:
    from specbench.strategies.dflash import STRATEGY as dflash
    from specbench.strategies.draft_model import STRATEGY as draft
    from specbench.strategies.dspark import STRATEGY as dspark
    from specbench.strategies.eagle import STRATEGY as eagle
    from specbench.strategies.mtp import STRATEGY as mtp
    from specbench.strategies.ngram import STRATEGY as ngram

    return {s.name: s for s in (ngram, draft, eagle, mtp, dflash, dspark)}


REGISTRY = _registry()
DRAFTER_NAMES = tuple(REGISTRY)


@dataclass(frozen=True)
class StrategySpec:
    """A parsed `--strategy` value: `ar`, one drafter, or a combination in canonical order."""

    members: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(self.members) or BASELINE


def parse_strategy(text: str) -> StrategySpec:
    text = text.strip().lower()
    if text == BASELINE:
        return StrategySpec(())
    members = [m.strip() for m in text.split("+")]
    for m in members:
        if m == BASELINE:
            raise SpecbenchError(f"strategy {text}: `ar` is the baseline of every run and cannot be combined")
        if m not in DRAFTER_NAMES:
            raise SpecbenchError(f"unknown strategy {m!r}; known: {', '.join((BASELINE,) + DRAFTER_NAMES)}")
    if len(set(members)) != len(members):
        raise SpecbenchError(f"strategy {text}: a combination cannot repeat a member")
    return StrategySpec(tuple(sorted(members, key=DRAFTER_NAMES.index)))


# the combinations `all` includes (DESIGN.md §3); any other combination can be named explicitly
COMBINATIONS = ("eagle+dflash", "mtp+dspark", "eagle+dspark", "dflash+dspark", "eagle+mtp")


def available_strategies() -> list[StrategySpec]:
    """Every implemented drafter, then every listed combination whose members are all implemented."""
    combos = [parse_strategy(c) for c in COMBINATIONS]
    return [StrategySpec((name,)) for name in REGISTRY] + [c for c in combos if set(c.members) <= set(REGISTRY)]


def parse_strategies(values: list[str]) -> list[StrategySpec]:
    """Repeatable / comma-separated values; `all` expands to every implemented strategy. `ar` first."""
    specs: list[StrategySpec] = [StrategySpec(())]
    for value in values:
        for text in value.split(","):
            if not text.strip():
                continue
            new = available_strategies() if text.strip().lower() == "all" else [parse_strategy(text)]
            specs.extend(s for s in new if s not in specs)
    return specs


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
    cls = REGISTRY[name].options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise SpecbenchError(f"unknown knob {name}.{key}; valid: {', '.join(f'{name}.{k}' for k in fields)}")
        kwargs[key] = _coerce(value, hints[key], f"{name}.{key}") if isinstance(value, str) else value
    return cls(**kwargs)


def validate_knobs(knobs: dict[str, dict[str, Any]]) -> None:
    """Check every knob of every implemented strategy before anything is loaded."""
    for name, values in knobs.items():
        if name in REGISTRY:
            make_options(name, values)


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


def drafter_dirs_by_strategy(dirs: list[Path]) -> dict[str, Path]:
    """Which strategy each --drafter directory is for: its config.json says (a plain HF LM is a `draft` model)."""
    from specbench.training.drafter_dir import read_drafter_config

    out: dict[str, Path] = {}
    for path in dirs:
        config = read_drafter_config(path)
        strategy = config.get("specbench_strategy") or ("draft" if "model_type" in config else None)
        if strategy is None:
            raise SpecbenchError(f"drafter directory {path}: config.json names no strategy and no model_type")
        if strategy in out:
            raise SpecbenchError(f"two --drafter directories for {strategy}: {out[strategy]} and {path}")
        out[strategy] = path
    return out


@dataclass
class Strategy:
    name: str
    drafter: Drafter | None
    new_controller: Callable[[], Controller] | None  # a fresh controller for every sequence


# a combination's members keep their own controllers; the engine-level one only caps the depth
COMBINED_MAX_DEPTH = 16


def build_strategy(spec: StrategySpec, target, knobs: dict[str, dict[str, Any]], drafter_dirs: dict[str, Path],
                   controller: str | None = None) -> Strategy:
    """The drafter(s) and controller factory of a parsed strategy; `controller` overrides every member's."""
    if not spec.members:
        return Strategy(BASELINE, None, None)
    if controller is not None and controller not in CONTROLLERS:
        raise SpecbenchError(f"unknown controller {controller!r}; known: {', '.join(CONTROLLERS)}")
    drafters, factories = [], []
    for name in spec.members:
        definition = REGISTRY[name]
        options = make_options(name, knobs.get(name, {}))
        drafters.append(definition.build(target, options, drafter_dirs.get(name)))
        factory = CONTROLLERS[controller or definition.default_controller]
        budget = definition.budget(options)
        factories.append(lambda factory=factory, budget=budget, options=options: factory(budget, options))
    if len(drafters) == 1:
        return Strategy(spec.name, drafters[0], factories[0])
    return Strategy(spec.name, CombinedDrafter(drafters, factories), lambda: FixedController(COMBINED_MAX_DEPTH))
