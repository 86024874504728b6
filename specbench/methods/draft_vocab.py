"""A reduced draft vocabulary: a drafter scores only the target's most frequent answer tokens.

A small target's LM head is a large share of its weights (SmolLM2-135M: 49,152 rows, a fifth of the
model), and a drafter that reuses it pays that on every draft token. VocabTrim (arXiv 2506.22694)
and FR-Spec (arXiv 2502.14856) keep only the N tokens the target itself emits most, EAGLE-3 ships
the map as `d2t` (SafeAILab/EAGLE, SpecForge). Here the rows are the target's own LM-head rows for
those ids, frozen and rebuilt from the target at load, so the drafter's file holds only the ids.

Drafted ids are mapped back to target ids, and the drafter's distribution q is zero outside the N
tokens: verification against the full target is unchanged, so greedy output and sampling stay exact
(a token q never proposes is accepted or resampled only through the target's residual).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.linear import linear
from specbench.methods.layers import lm_head
from specbench.methods.search_space import knob


def draft_vocab_knob() -> Any:
    """The knob every learned method declares for its draft vocabulary's size (it shapes the drafter)."""
    return knob(0, "tokens the drafter scores when training: the target's N most frequent answer tokens "
                   "(0 = its whole vocabulary)", "tokens", low=0, architecture=True)


def frequent_tokens(answers: Iterable[list[int]], size: int, vocab: int) -> torch.Tensor:
    """The `size` ids most frequent in `answers`, most frequent first (ties by id); ids never seen fill up
    the rest in id order, so that any size up to the vocabulary is one."""
    check_size(size, vocab)
    counts = Counter(t for answer in answers for t in answer)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    if len(ranked) < size:
        taken = set(ranked)
        ranked += [t for t in range(vocab) if t not in taken][:size - len(ranked)]
    return torch.tensor(ranked, dtype=torch.long)


def check_size(size: int, vocab: int) -> None:
    if not 0 < size <= vocab:
        raise SpecbenchError(f"draft vocabulary of {size}: give 1 to the target's {vocab} tokens")


def check_ids(ids: torch.Tensor, vocab: int, where: str) -> None:
    """A draft vocabulary must name distinct target ids inside the target's vocabulary."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise SpecbenchError(f"{where}: its draft vocabulary names ids outside the target's {vocab} (a map built "
                             "for another tokenizer?)")
    if len(torch.unique(ids)) != len(ids):
        raise SpecbenchError(f"{where}: its draft vocabulary maps two draft ids to one target id")


class DraftVocab(nn.Module):
    """The target's LM head, or its rows for the ids `ids` (draft id i is target id ids[i])."""

    def __init__(self, target_model: nn.Module, size: int | None = None):
        """`size` None: the whole vocabulary, the target's head itself. Otherwise the ids are a buffer
        of the drafter's state (set with `set_ids`, or by loading a state_dict)."""
        super().__init__()
        object.__setattr__(self, "target", target_model)
        self.vocab = target_model.get_output_embeddings().weight.shape[0]
        self.full = size is None
        if not self.full:
            check_size(size, self.vocab)
            self.register_buffer("ids", torch.arange(size))

    @property
    def size(self) -> int:
        return self.vocab if self.full else len(self.ids)

    def _load_from_state_dict(self, state, prefix, *args) -> None:
        super()._load_from_state_dict(state, prefix, *args)
        if not self.full:
            check_ids(self.ids, self.vocab, "the drafter")

    def set_ids(self, ids: torch.Tensor) -> DraftVocab:
        check_ids(ids, self.vocab, "the drafter")
        self.ids = ids.to(self.ids.device)
        return self

    def _rows(self, dtype: torch.dtype) -> torch.Tensor:
        """The head's rows for `ids` in `dtype`, gathered again only when the ids, the head or the dtype change
        (a load, `.to`)."""
        weight = self.target.get_output_embeddings().weight
        key = (self.ids.data_ptr(), self.ids._version, weight.data_ptr(), weight.dtype, dtype)
        cached = self.__dict__.get("_cached")
        if cached is None or cached[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                cached = (key, weight.detach()[self.ids].to(dtype).contiguous())
            self.__dict__["_cached"] = cached
        return cached[1]

    def compact(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (..., size)."""
        if self.full:
            return lm_head(self.target, hidden.to(self.target.get_output_embeddings().weight.dtype))
        rows = self._rows(hidden.dtype)
        return F.linear(hidden, rows) if torch.is_grad_enabled() else linear(hidden, rows)

    def expand(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits as target-vocabulary ones: -inf at every id the drafter cannot propose."""
        if self.full:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab), float("-inf"))
        out[..., self.ids] = logits
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits of the draft head: what drafting and its controllers read."""
        return self.expand(self.compact(hidden))

    def target_probs(self, final: torch.Tensor) -> torch.Tensor:
        """The target's next-token distribution from its final normed state, renormalised over the draft
        vocabulary (the soft label a drafter over these tokens can match; SpecForge's target_p)."""
        return self.compact(final).float().softmax(-1)

    def labels(self, target_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Target ids as draft ids, and whether each is in the draft vocabulary (draft id 0 where not)."""
        if self.full:
            return target_ids, torch.ones_like(target_ids, dtype=torch.bool)
        table = torch.full((self.vocab,), -1, dtype=torch.long, device=target_ids.device)
        table[self.ids] = torch.arange(len(self.ids), device=target_ids.device)
        mapped = table[target_ids]
        return mapped.clamp_min(0), mapped >= 0
