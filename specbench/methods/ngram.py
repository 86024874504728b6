"""Prompt lookup: copy what followed an earlier occurrence of the context's last n-gram.

Of several occurrences, the latest one with a full draft after it is used (recent text predicts
best); in a repetitive tail the latest occurrence sits right before the end and would leave only a
token or two to copy, so then the earliest (the longest continuation) is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method
from specbench.methods.search_space import Choice, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.methods.serving import Serving, fixed_only


@dataclass
class NgramOptions:
    max_ngram: int = knob(3, "longest context suffix looked up (then shorter ones)", "tokens", low=1)
    num_pred_tokens: int = knob(8, "tokens copied after the match: the draft length", "tokens", low=1)

    def __post_init__(self) -> None:
        check_ranges(self, "ngram.")


# centred on the defaults (3-grams in 1..5, 8 drafts at the geometric centre of 2..32); the heuristic
# controller adapts the draft length to how often whole drafts are accepted
SPACE = SearchSpace((
    Param("controller", Choice(("fixed", "heuristic"))),
    Param("max_ngram", IntRange(1, 5)),
    Param("num_pred_tokens", IntRange(2, 32, log=True)),
))


class NgramDrafter(Drafter):
    name = "ngram"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, options: NgramOptions):
        self.options = options

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        tokens = ctx.tokens
        for n in range(min(self.options.max_ngram, len(tokens) - 1), 0, -1):
            windows = tokens[:-1].unfold(0, n, 1)  # every n-gram that has a successor
            hits = (windows == tokens[-n:]).all(-1).nonzero()
            if len(hits):
                starts = hits[:, 0] + n
                # the latest occurrence that still has a full draft after it; else the earliest (longest)
                full = starts[len(tokens) - starts >= ctx.budget]
                start = int(full[-1]) if len(full) else int(starts[0])
                tree = DraftTree.chain(tokens[start:start + ctx.budget].tolist(), self.name)
                # a longer match predicts better, a deeper token less well
                tree.scores = [(n / (n + 1)) ** depth for depth in range(1, len(tree) + 1)]
                return tree
        return DraftTree()

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def state_bytes(self) -> int:
        return 0


def _build(target, options: NgramOptions, drafter_dir) -> NgramDrafter:
    if drafter_dir is not None:
        raise SpecbenchError("ngram needs no --drafter directory")
    return NgramDrafter(options)


def _serving(o: NgramOptions, controller: str, drafter: str) -> Serving:
    vllm = {"method": "ngram", "num_speculative_tokens": o.num_pred_tokens, "prompt_lookup_max": o.max_ngram,
            "prompt_lookup_min": 1}
    sglang = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", o.num_pred_tokens,
              "--speculative-ngram-min-match-window-size", 1, "--speculative-ngram-max-match-window-size", o.max_ngram]
    return Serving(vllm, sglang, fixed_only(controller), fixed_only(controller))


STRATEGY = Method("ngram", NgramOptions, _build, budget=lambda o: o.num_pred_tokens,
                  short_draft=lambda n: {"num_pred_tokens": n}, space=SPACE, serving=_serving, model_free=True)
