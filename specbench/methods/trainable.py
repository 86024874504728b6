"""The contract of a trainable drafter, beside the engine's `Drafter` protocol.

`specbench train` (training/) builds a fresh network with a strategy's `trainable` factory, feeds
it `DistillBatch`es of the target's own answers and hidden states, and saves what
`drafter_config()` and `state_dict()` return. The network reads the target's embedding and LM
head without registering them, so its state_dict holds only its own weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class DistillBatch:
    input_ids: torch.Tensor  # (B, T), padded with 0
    hidden: torch.Tensor  # (B, len(layers) + 1, T, H) float32: the requested layers, then the final normed state
    mask: torch.Tensor  # (B, T) bool: positions inside an answer (prediction targets)
    attention: torch.Tensor  # (B, T) bool: real (not padding) positions

    @property
    def final(self) -> torch.Tensor:
        """The target's final normed hidden state; its LM head maps it to the target's logits."""
        return self.hidden[:, -1]


class TrainableDrafter(Protocol):
    hidden_layers: tuple[int, ...]  # target hidden-state layers the drafter reads (HF `hidden_states` indices)

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """The method's loss on one batch, a scalar."""

    def drafter_config(self) -> dict[str, Any]:
        """What rebuilds the network's shape when the drafter directory is loaded."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...
