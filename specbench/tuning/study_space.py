"""A study's search space, assembled from the spaces its strategy's methods declare.

One method: its own space, with the loaded drafter's limits filled in and the knobs (and controller)
the workload holds fixed taken out. A combination: each member's space prefixed by the member
(`eagle.depth`); members keep their own controllers there (a run config has one controller override
for all of them), so each member's controller choice is fixed at its default and the parameters it
conditions follow from that; and how it combines them (`combine.mode`, its budget, its router's
thresholds and hysteresis: methods/combine_options.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.engines.engine_registry import backend
from specbench.methods.build import Strategy
from specbench.methods.combine_options import COMBINE, CombineOptions
from specbench.methods.combine_options import SPACE as COMBINE_SPACE
from specbench.methods.names import StrategyName
from specbench.methods.registry import definition
from specbench.methods.search_space import SearchSpace

CONTROLLER = "controller"


@dataclass(frozen=True)
class StudySpace:
    spec: StrategyName
    space: SearchSpace
    fixed_knobs: dict[str, dict[str, Any]]  # held at these values by the workload, not searched
    fixed_controller: str | None
    # per member: the knobs its drafter runs with (loaded here, translated for vLLM, or behind a server), the
    # shape recorded with it under the workload's knobs
    drafting: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def single(self) -> bool:
        return len(self.spec.members) == 1

    def defaults(self) -> dict[str, Any]:
        """The point a run without tuning would use: the workload's knobs, else the drafting knobs its drafter
        carries (chosen for it on its model), else each method's defaults."""
        source: dict[str, Any] = {}
        for name in self.spec.members:
            method = definition(name)
            prefix = "" if self.single else f"{name}."
            defaults = method.options()
            values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
            values.update(self.drafting.get(name, {}))
            values.update(self.fixed_knobs.get(name, {}))
            values[CONTROLLER] = self.fixed_controller or method.default_controller
            source.update({prefix + k: v for k, v in values.items()})
        if not self.single:
            combine = {**dataclasses.asdict(CombineOptions()), **self.fixed_knobs.get(COMBINE, {})}
            source.update({f"{COMBINE}.{k}": v for k, v in combine.items()})
        return self.space.point(source)

    def run_settings(self, params: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], str | None]:
        """The knobs per member and the controller override that run a point of this space."""
        knobs = {name: dict(values) for name, values in self.fixed_knobs.items()}
        controller = self.fixed_controller
        for key, value in params.items():
            if self.single:
                if key == CONTROLLER:
                    controller = value
                    continue
                member, knob = self.spec.members[0], key
            else:
                member, _, knob = key.partition(".")
            knobs.setdefault(member, {})[knob] = value
        return knobs, controller


def _limits(spec: StrategyName, strategy: Strategy | None) -> dict[str, dict[str, int]]:
    """Per member: the values of its loaded drafter that its space's bounds may name (none when another
    engine or a server runs the strategy: its drafter is not loaded here)."""
    if strategy is None or strategy.drafter is None:
        return {name: {} for name in spec.members}
    out = {}
    for name, drafter in zip(spec.members, strategy.drafter.members, strict=True):
        limits = definition(name).limits
        out[name] = limits(drafter) if limits else {}
    return out


def _drafting(spec: StrategyName, strategy: Strategy | None) -> dict[str, dict[str, Any]]:
    """Per member: the knobs its drafter drafts with when a run gives none (build_member, or vLLM's
    translation of them)."""
    if strategy is None:
        return {}
    return {name: strategy.drafter_sources[name]["knobs"] for name in spec.members if name in strategy.drafter_sources}


def engine_knobs_only(space: SearchSpace, name: str, engine: str) -> SearchSpace:
    """A method's space as an engine runs it: the knobs (and the controller) the engine has no counterpart
    for stay at their defaults, as `run --engine` leaves them."""
    method = definition(name)
    defaults = method.options()
    for knob in backend(engine).untunable(name):
        space = space.fix(knob, method.default_controller if knob == CONTROLLER else getattr(defaults, knob))
    return space


def study_space(spec: StrategyName, built: Strategy | None, fixed_knobs: dict[str, dict[str, Any]],
                fixed_controller: str | None, engine: str,
                drafting: dict[str, dict[str, Any]] | None = None) -> StudySpace:
    """The space of `spec` in `engine`, given the strategy built with its defaults (for the drafters' limits
    and their drafting knobs; None: a server runs it, and `drafting` gives the knobs its drafter carries)."""
    limits = _limits(spec, built)
    space = SearchSpace()
    for name in spec.members:
        method = definition(name)
        member = method.space
        for limit, value in limits[name].items():
            member = member.fix(limit, value)
        for knob, value in fixed_knobs.get(name, {}).items():
            member = member.fix(knob, value)
        if fixed_controller is not None or len(spec.members) > 1:
            member = member.fix(CONTROLLER, fixed_controller or method.default_controller)
        member = engine_knobs_only(member, name, engine)
        space += member if len(spec.members) == 1 else member.prefixed(f"{name}.")
    if len(spec.members) > 1:
        combine = COMBINE_SPACE
        for knob, value in fixed_knobs.get(COMBINE, {}).items():
            combine = combine.fix(knob, value)
        space += combine.prefixed(f"{COMBINE}.")
    if not space:
        raise SpecbenchError(f"strategy {spec.name}: nothing left to search, the configuration fixes every knob")
    return StudySpace(spec, space, fixed_knobs, fixed_controller,
                      _drafting(spec, built) if drafting is None else drafting)
