"""What a strategy module declares: its name, its knobs and how to build its drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specbench.engine.protocol import Drafter


@dataclass(frozen=True)
class StrategyDef:
    name: str
    options: type  # dataclass of knobs with defaults
    build: Callable[..., Drafter]  # (target, options, drafter_dir | None) -> Drafter
    budget: Callable[[Any], int]  # the controller's starting depth from the knobs
    default_controller: str = "fixed"
    trainable: Callable[..., Any] | None = None  # (target, options) -> a fresh trainable drafter nn.Module
