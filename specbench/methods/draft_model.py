"""Standard speculative decoding: a separate small LM drafts a chain, one token per forward.

The draft LM is any causal LM sharing the target's vocabulary (--drafter DIR), or the one a known model
keeps. `specbench prepare` cuts one from the target itself (DraftLM): its first layers and its last,
its final norm and its tied embedding and head, fine-tuned to the target's distribution on the
target's own answers. The early layers carry the token and its local context; the last layer is the
one that writes into the head's input space, so the cut model starts close to the target's outputs
(early-exit drafting through the shared head, as LayerSkip, arXiv 2404.16710, does with its first
layers alone).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.kv_cache import new_cache, run_model, state_bytes, truncate
from specbench.decoding.target import fingerprint, load_lm
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method, default_drafter_dir
from specbench.methods.layers import lm_head
from specbench.methods.search_space import Choice, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.methods.serving import DRAFTER, Serving, fixed_only
from specbench.methods.trainable import DistillBatch

FIRST_LAYERS = 3  # a DraftLM keeps the target's first three layers and its last one


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


class DraftLM(nn.Module):
    """A draft LM cut from its target (trainable): a causal LM of the target's class whose layers are the
    target's first FIRST_LAYERS and its last. Its state_dict is a causal LM checkpoint (`model.*`, the head
    tied to the embedding), so the saved drafter directory loads as a model, in specbench and in vLLM."""

    hidden_layers: tuple[int, ...] = ()  # it reads tokens, not target features

    def __init__(self, target_model: nn.Module, layers: tuple[int, ...]):
        super().__init__()
        object.__setattr__(self, "target", target_model)
        config = copy.deepcopy(target_model.config)
        config.num_hidden_layers = len(layers)
        config.layer_types = None
        config.architectures = [type(target_model).__name__]
        lm = type(target_model)(config)
        lm.model.embed_tokens.load_state_dict(target_model.model.embed_tokens.state_dict())
        lm.model.norm.load_state_dict(target_model.model.norm.state_dict())
        for mine, theirs in zip(lm.model.layers, layers):
            mine.load_state_dict(target_model.model.layers[theirs].state_dict())
        lm.model.embed_tokens.weight.requires_grad_(False)  # tied to the head: the target's, kept
        self.model = lm.model
        self.config = config
        self.layers = layers

    @classmethod
    def for_target(cls, target, options: DraftOptions | None = None) -> DraftLM:
        count = target.model.config.num_hidden_layers
        layers = tuple(range(min(FIRST_LAYERS, count - 1))) + (count - 1,)
        return cls(target.model, layers).to(target.device, target.model.dtype)

    def drafter_config(self) -> dict:
        return {**self.config.to_dict(), "tie_word_embeddings": True, "cut_from_layers": list(self.layers)}

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """Soft cross-entropy against the target's next-token distribution over the answer positions."""
        hidden = self.model(input_ids=batch.input_ids, attention_mask=batch.attention.long()).last_hidden_state
        with torch.no_grad():
            p = lm_head(self.target, batch.final).float().softmax(-1)
        ce = -(p * lm_head(self.target, hidden).float().log_softmax(-1)).sum(-1)
        valid = batch.mask.float()
        return (ce * valid).sum() / valid.sum().clamp_min(1.0)


def _build(target, options: DraftOptions, drafter_dir) -> DraftModelDrafter:
    path = default_drafter_dir(target, "draft", drafter_dir)
    model = load_lm(str(path), target.device, target.model.dtype)
    if model.config.vocab_size != target.model.config.vocab_size:
        raise SpecbenchError(f"draft model {path}: vocabulary size {model.config.vocab_size} "
                             f"differs from the target's {target.model.config.vocab_size}")
    trained_for = getattr(model.config, "target_fingerprint", None)  # a DraftLM names its target
    if trained_for is not None and trained_for != fingerprint(target.model):
        raise SpecbenchError(f"drafter {path} was trained for another target (fingerprint {trained_for}, "
                             f"this target is {fingerprint(target.model)})")
    return DraftModelDrafter(model, options)


def _serving(o: DraftOptions, controller: str, drafter: str | None) -> Serving:
    path = drafter or DRAFTER
    sglang = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", path,
              "--speculative-num-steps", o.k, "--speculative-eagle-topk", 1, "--speculative-num-draft-tokens", o.k + 1]
    return Serving({"method": "draft_model", "model": path, "num_speculative_tokens": o.k}, sglang,
                   fixed_only(controller), fixed_only(controller))


STRATEGY = Method("draft", DraftOptions, _build, budget=lambda o: o.k, short_draft=lambda n: {"k": n},
                  trainable=DraftLM.for_target, space=SPACE, serving=_serving, vllm_drafter=True)
