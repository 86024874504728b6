"""Standard speculative decoding: a separate small LM drafts a chain, one token per forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.kv_cache import new_cache, run_model, state_bytes, truncate
from specbench.engine.protocol import DraftContext, Drafter, StepOutcome
from specbench.engine.tree import DraftTree
from specbench.errors import SpecbenchError
from specbench.models import DEFAULT_DIR, load_lm
from specbench.strategies.base import Method
from specbench.strategies.search_space import Choice, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.strategies.serving import DRAFTER, Serving, fixed_only

DEFAULT_DRAFT = DEFAULT_DIR / "draft"  # the embedded default's draft LM


@dataclass
class DraftOptions:
    k: int = knob(5, "tokens the draft model proposes per step (the controller's starting depth)", "tokens", low=1)

    def __post_init__(self) -> None:
        check_ranges(self, "draft.")


# k around its default 5; the heuristic and entropy controllers are the draft-length rules of HF
# transformers' assistants and of AdaEDL
SPACE = SearchSpace((
    Param("controller", Choice(("fixed", "heuristic", "entropy"))),
    Param("k", IntRange(1, 10)),
))


class DraftModelDrafter(Drafter):
    name = "draft"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model, options: DraftOptions):
        self.model = model
        self.options = options
        self.cache = None
        self.cached = torch.empty(0, dtype=torch.long)  # the tokens whose KV is in self.cache

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.cache = new_cache(self.model)
        self.cached = prompt[:0]

    def _sync(self, tokens: torch.Tensor) -> torch.Tensor:
        """Drop cached positions that diverge from `tokens`; return the tokens still to feed."""
        n = min(len(self.cached), len(tokens) - 1)
        differ = (self.cached[:n] != tokens[:n]).nonzero()
        keep = int(differ[0]) if len(differ) else n
        truncate(self.cache, keep)
        return tokens[keep:]

    def propose(self, ctx: DraftContext) -> DraftTree:
        feed = self._sync(ctx.tokens)
        self.cached = ctx.tokens[:len(ctx.tokens) - len(feed)]
        drafted: list[int] = []
        qs: list[torch.Tensor | None] = []
        for depth in range(ctx.budget):
            logits = run_model(self.model, self.cache, feed[None]).logits[0, -1]
            self.cached = torch.cat([self.cached, feed])
            q = None if ctx.sampling.greedy else ctx.sampling.probs(logits)
            token = int(logits.argmax()) if q is None else ctx.rng.draw(q)
            drafted.append(token)
            qs.append(q)
            if not ctx.controller.keep_drafting(depth + 1, logits):
                break
            feed = torch.tensor([token], device=ctx.tokens.device)
        return DraftTree.chain(drafted, self.name, qs)

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def state_bytes(self) -> int:
        return state_bytes(self.cache)


def _build(target, options: DraftOptions, drafter_dir) -> DraftModelDrafter:
    path = drafter_dir or DEFAULT_DRAFT
    if drafter_dir is None and target.name != "default":
        raise SpecbenchError("strategy draft: give the draft model with --drafter DIR")
    model = load_lm(str(path), target.device, target.model.dtype)
    if model.config.vocab_size != target.model.config.vocab_size:
        raise SpecbenchError(f"draft model {path}: vocabulary size {model.config.vocab_size} "
                             f"differs from the target's {target.model.config.vocab_size}")
    return DraftModelDrafter(model, options)


def _serving(o: DraftOptions, controller: str, drafter: str | None) -> Serving:
    path = drafter or DRAFTER
    sglang = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", path,
              "--speculative-num-steps", o.k, "--speculative-eagle-topk", 1, "--speculative-num-draft-tokens", o.k + 1]
    return Serving({"method": "draft_model", "model": path, "num_speculative_tokens": o.k}, sglang,
                   fixed_only(controller), fixed_only(controller))


STRATEGY = Method("draft", DraftOptions, _build, budget=lambda o: o.k, short_draft=lambda n: {"k": n},
                  space=SPACE, serving=_serving)
