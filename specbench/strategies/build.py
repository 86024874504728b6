"""From parsed strategy specs to what the engine runs: drafters and a controller factory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specbench.engine.protocol import Controller, Drafter
from specbench.errors import SpecbenchError
from specbench.strategies.combine import CombinedDrafter
from specbench.strategies.controllers import CONTROLLERS, FixedController
from specbench.strategies.drafter_dir import read_drafter_config
from specbench.strategies.knobs import make_options
from specbench.strategies.registry import definition
from specbench.strategies.spec import BASELINE, StrategySpec


def drafter_dirs_by_strategy(dirs: list[Path]) -> dict[str, Path]:
    """Which strategy each --drafter directory is for: its config.json says (a plain HF LM is a `draft` model)."""
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
    tree: bool = False  # verifies token trees (a tree drafter or a combination's merged trie): batch size 1 only


def verifies_trees(spec: StrategySpec) -> bool:
    """A tree drafter, or a combination (its members' proposals merge into a trie)."""
    return len(spec.members) > 1 or any(definition(m).tree for m in spec.members)


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
        method = definition(name)
        options = make_options(name, knobs.get(name, {}))
        drafters.append(method.build(target, options, drafter_dirs.get(name)))
        factory = CONTROLLERS[controller or method.default_controller]
        budget = method.budget(options)
        factories.append(lambda factory=factory, budget=budget, options=options: factory(budget, options))
    if len(drafters) == 1:
        return Strategy(spec.name, drafters[0], factories[0], verifies_trees(spec))
    return Strategy(spec.name, CombinedDrafter(drafters, factories), lambda: FixedController(COMBINED_MAX_DEPTH),
                    tree=True)
