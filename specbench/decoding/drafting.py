"""The seam between the engine and the strategies.

A drafter proposes a token tree for the next positions and learns from each verification; a
controller decides how much to propose. The engine owns the target, its KV cache and all timing:
a drafter never times itself and never touches the target's cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specbench.decoding.sampling import Rng, Sampling
from specbench.decoding.tree import DraftTree


@dataclass
class DraftContext:
    tokens: torch.Tensor  # committed token ids, 1D, on the target's device; the last one is not in the target cache yet
    budget: int  # how many positions deep the controller allows this step
    sampling: Sampling
    rng: Rng  # every draw goes through it
    controller: Controller


@dataclass
class StepOutcome:
    tree: DraftTree
    path: list[int]  # accepted node indices, root to leaf
    bonus: int  # the target's own token after the accepted path
    committed: list[int]  # tokens committed this step: accepted drafts then the bonus (cut at EOS / length)
    hidden: tuple[torch.Tensor, ...]  # per requested layer: (positions committed to the target cache this step, hidden)
    logits: torch.Tensor | None = None  # the target's logits at the row the bonus was drawn from


class Controller(Protocol):
    def budget(self) -> int:
        """Positions to draft this step."""

    def keep_drafting(self, depth: int, logits: torch.Tensor) -> bool:
        """Whether to draft beyond `depth`, given the drafter's raw logits at that depth."""

    def update(self, drafted: int, accepted: int) -> None:
        """Learn from one verification: depth drafted, draft tokens accepted."""


class Drafter(Protocol):
    """What the engine and the measurements read of a drafter. A drafter class subclasses it, so that
    the attributes with a default need declaring only where they differ."""

    name: str
    hidden_layers: tuple[int, ...]  # target hidden-state layers it reads (0 = embeddings); () for none
    options: Any  # its knob dataclass, as the method's Method declares it
    model: torch.nn.Module | None = None  # its network (weights, costs, memory); None for a model-free drafter
    max_depth: int | None = None  # the deepest draft its network allows, whatever the knobs (a block's drafts)
    parallel_draft: bool = False  # drafts its whole depth in one forward (a block drafter), not a forward a level

    @property
    def members(self) -> list[Drafter]:
        """The drafters it runs: a combination's members, else itself."""
        return [self]

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        """A new sequence: its prompt, and the target's hidden states of every prompt token but the last.

        It (re)sets every piece of per-sequence state, so a shallow copy of a drafter shares its weights
        and nothing else: batched decoding (decoding/batch.py) runs one copy per sequence."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        """Draft up to ctx.budget positions ahead of ctx.tokens."""

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from the verification of the last proposal."""

    def state_bytes(self) -> int:
        """Bytes of the per-sequence state it holds now (its caches), for the memory a strategy needs."""
