"""From parsed strategy specs to what the engine runs: drafters and a controller factory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from specbench.core.engine_names import SPECBENCH, label
from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import Controller, Drafter
from specbench.methods import published
from specbench.methods.base import drafting_defaults
from specbench.methods.combine import CombinedDrafter
from specbench.methods.combine_options import COMBINE
from specbench.methods.controllers import CONTROLLERS, FixedController
from specbench.methods.knobs import make_options
from specbench.methods.names import BASELINE, StrategyName
from specbench.methods.published.formats import DrafterSource
from specbench.methods.registry import definition


@dataclass
class Strategy:
    name: str
    drafter: Drafter | None
    new_controller: Callable[[], Controller] | None  # a fresh controller for every sequence
    # member (another engine: that engine) -> where its drafter came from and the knobs it runs with, as
    # environment.json records them; a combination's `combine` entry: how it combines them
    drafter_sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    tree: bool = False  # verifies token trees (a tree drafter or a combination's merged trie): batch size 1 only
    engine: str = SPECBENCH  # which engine decodes it (engines/): the others' strategies have no drafter here
    # decodes one prompt: (prompt, max_new_tokens, sampling, seed) -> Generation (engines/protocol.py Runner)
    runner: Callable[[list[int], int, Any, int], Any] | None = None

    @property
    def label(self) -> str:
        """The name, with the engine where it is not specbench's own: `ngram`, `ngram@vllm`."""
        return label(self.name, self.engine)


def verifies_trees(spec: StrategyName) -> bool:
    """A tree drafter, or a combination (its members' proposals merge into a trie)."""
    return len(spec.members) > 1 or any(definition(m).tree for m in spec.members)


# a combination's members keep their own controllers; the engine-level one only caps the depth
COMBINED_MAX_DEPTH = 16


def drafter_knobs(name: str, target, source: DrafterSource | None) -> dict[str, Any]:
    """The knob values method `name`'s drafter carries for itself, which the user's go over: a published
    checkpoint's own (its block size, ...), else the drafting shape chosen for specbench's drafter (the
    known model's own without a `source`)."""
    if source is not None and source.published:
        return published.knob_defaults(source)
    return drafting_defaults(target, name, source.path if source else None)


def build_member(name: str, target, knobs: dict[str, Any], source: DrafterSource | None) -> tuple[Drafter, Any]:
    """One method's drafter and knobs: from a published checkpoint, the target's own MTP modules, or
    specbench's own drafter directory (the embedded default's without one), the user's knobs over the
    drafter's own."""
    options = make_options(name, {**drafter_knobs(name, target, source), **knobs})
    if source is not None and source.published:
        return published.load(source, target, options), options
    return definition(name).build(target, options, source.path if source else None), options


def describe(source: DrafterSource | None, options: Any) -> dict[str, Any]:
    where = source.describe() if source else {"format": "specbench", "path": None}
    return {**where, "knobs": dataclasses.asdict(options)}


def controller_factory(name: str, drafter, options: Any, controller: str | None = None) -> Callable[[], Controller]:
    """What makes a fresh controller of method `name`'s drafter: `controller`, else the method's own, over the
    drafter's budget."""
    method = definition(name)
    factory = CONTROLLERS[controller or method.default_controller]
    # a block drafter knows how many drafts its block holds (DeepSpec's layout drafts one more)
    budget = drafter.max_depth or method.budget(options)
    return lambda: factory(budget, options)


def build_strategy(spec: StrategyName, target, knobs: dict[str, dict[str, Any]],
                   sources: dict[str, DrafterSource], controller: str | None = None) -> Strategy:
    """The drafter(s) and controller factory of a parsed strategy; `controller` overrides every member's."""
    if not spec.members:
        return Strategy(BASELINE, None, None)
    if controller is not None and controller not in CONTROLLERS:
        raise SpecbenchError(f"unknown controller {controller!r}; known: {', '.join(CONTROLLERS)}")
    drafters, factories, described = [], [], {}
    for name in spec.members:
        source = sources.get(name) or published.builtin_source(name, target)
        drafter, options = build_member(name, target, knobs.get(name, {}), source)
        drafters.append(drafter)
        described[name] = describe(source, options)
        factories.append(controller_factory(name, drafter, options, controller))
    if len(drafters) == 1:
        return Strategy(spec.name, drafters[0], factories[0], described, verifies_trees(spec))
    combined = CombinedDrafter(drafters, factories, make_options(COMBINE, knobs.get(COMBINE, {})))
    described[COMBINE] = {"knobs": dataclasses.asdict(combined.combine)}
    return Strategy(spec.name, combined, lambda: FixedController(COMBINED_MAX_DEPTH), described, tree=True)
