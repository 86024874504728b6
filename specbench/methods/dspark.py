"""DSpark (deepseek-ai/DeepSpec, 2026): the DFlash block drafter plus a Markov head and a confidence head.

The block network is DFlash's (methods/dflash.py) in DeepSpec's shifted layout: the block
[last committed token, MASK x (B-1)] drafts B tokens, slot k drafting position n+k, so the anchor
slot drafts too (DFlash throws its output away). Two small heads then run sequentially over the
block, one cheap step per position:

- Markov head (DeepSpec's "vanilla" head): position k's logits get a low-rank correction from the
  token before it (the last committed token for k = 0, else draft k-1):
  logits_k += W2(W1[prev]), W1 a rank-r embedding of the vocabulary, W2 a rank-r -> vocabulary map.
- Confidence head: sigmoid(w . [hidden_k, W1[prev]] + b), an estimate of 1 - TV(p_draft, p_target),
  the probability that the target accepts draft k. The block is cut before the first position where
  the cumulative product of confidences (the estimated probability that the whole prefix is
  accepted) falls below `confidence_threshold` (`confidence_rule = cumulative`); `token` is DeepSpec's
  rule, a cut at the first position whose own confidence is below it, and the default for DeepSpec's
  checkpoints (methods/published/).

Loss as DeepSpec's loss.py: 0.1 CE + 0.9 L1 + 1.0 BCE, each weighted exp(-k / gamma) over the block.
The distribution term is the L1 distance sum |p_draft - p_target| (= 2 TV) as in DeepSpec's code;
the confidence head's BCE target is 1 - TV, detached; the Markov head is teacher-forced with the
target's tokens. The draft-length scheduler (methods/dspark_scheduler.py) is the default controller.

Default confidence_threshold 0.2 (DeepSpec's evaluator defaults to 0, no cut; neither the paper's
code nor the practitioners' write-ups give a value): on the CPU default target one more verified position
costs about a twentieth of a target forward (measured on two cores: ~20 ms to verify 1 token,
~28 ms for 8), and one drafted position of the 2-layer drafter about as much again, so at a
typical 4 tokens per step a draft whose whole prefix survives with probability under ~0.2
costs more than it is expected to earn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import DraftContext
from specbench.decoding.linear import Linear
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method
from specbench.methods.dflash import BlockConfig, DFlashDrafter, DFlashModel, pick
from specbench.methods.draft_vocab import draft_vocab_knob
from specbench.methods.dspark_scheduler import SCHEDULER_SPACE, SchedulerKnobs
from specbench.methods.search_space import Choice, FloatRange, IntRange, Param, SearchSpace, knob, knob_infos
from specbench.methods.serving import DRAFTER, Serving, fixed_only
from specbench.methods.trainable import DistillBatch

CE_WEIGHT, L1_WEIGHT, CONFIDENCE_WEIGHT = 0.1, 0.9, 1.0  # DeepSpec's dspark config
# where the block is cut: specbench's cumulative product of confidences (the estimated probability that the
# whole prefix is accepted), or DeepSpec's first position whose own confidence is below the threshold
CONFIDENCE_RULES = ("cumulative", "token")


@dataclass
class DSparkOptions(SchedulerKnobs):  # the scheduler's knobs are dspark's too: the default controller
    # DeepSpec's value: with the last token, a verify length of 8
    block_size: int = knob(7, "drafts per block (the anchor slot drafts too)", "positions", low=1)
    confidence_threshold: float = knob(0.2, "cut the block where the confidence (confidence_rule) falls below "
                                            "this (0 = never)", "probability", low=0, high=1)
    confidence_rule: str = knob("cumulative", "cumulative: the product of the confidences so far; token: each "
                                              "position's own (DeepSpec's rule)", "one of cumulative, token")
    context_window: int = knob(512, "W: context positions the drafter sees (0 = all)", "tokens", low=0)
    layers: int = knob(2, "draft layers (used when training)", "layers", low=1, architecture=True)
    markov_rank: int = knob(32, "Markov head rank (used when training)", "", low=1, architecture=True)
    # DeepSpec's value
    gamma: float = knob(4.0, "training position weights exp(-k / gamma)", "positions", low=0, above=True,
                        architecture=True)
    draft_vocab: int = draft_vocab_knob()

    def __post_init__(self) -> None:
        self.check(prefix="dspark.")
        if self.confidence_rule not in CONFIDENCE_RULES:
            raise SpecbenchError(f"dspark.confidence_rule must be one of {', '.join(CONFIDENCE_RULES)}, "
                                 f"got {self.confidence_rule!r}")


# the block and threshold around their defaults (7 drafts, 0.2 in 0..0.6), the window as dflash's, then
# the controller: the article's scheduler (its knobs searched only when it is chosen) or another rule
SPACE = SearchSpace((
    Param("block_size", IntRange(2, 16)),
    Param("confidence_threshold", FloatRange(0.0, 0.6)),
    Param("confidence_rule", Choice(CONFIDENCE_RULES)),
    Param("context_window", IntRange(128, 2048, log=True)),
    Param("controller", Choice(("dspark", "fixed", "heuristic", "entropy"))),
)) + SCHEDULER_SPACE


class DSparkModel(DFlashModel):
    def __init__(self, target: nn.Module, config: BlockConfig, options):
        super().__init__(target, config, options)
        self.markov_in = nn.Embedding(config.vocab_size, config.markov_rank)
        self.markov_out = Linear(config.markov_rank, self.vocab.size, bias=False)
        nn.init.normal_(self.markov_out.weight, std=0.02)  # starts as a small correction
        self.confidence = Linear(config.arch.hidden_size + config.markov_rank, 1)

    @classmethod
    def architecture(cls, model: nn.Module, options) -> BlockConfig:
        return dataclasses.replace(super().architecture(model, options), shifted=True, markov_rank=options.markov_rank)

    def heads(self, hidden: torch.Tensor, logits: torch.Tensor,
              prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Markov-corrected logits and confidence logits of draft slots, given the token before each."""
        memory = self.markov_in(prev)
        return logits + self.markov_out(memory), self.confidence(torch.cat([hidden, memory], -1))[..., 0]

    def step_heads(self, hidden: torch.Tensor, logits: torch.Tensor, prev: torch.Tensor,
                   state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One draft slot at inference: its logits, its confidence logit (None: no confidence head) and the
        heads' state carried to the next slot (recurrent heads; None here)."""
        return *self.heads(hidden, logits, prev), None

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """0.1 CE + 0.9 L1 against the target's distribution + BCE of the confidence towards 1 - TV."""
        b = self.blocks(batch, *self.sample_anchors(batch))
        logits, confidence = self.heads(b.hidden, self.logits(b.hidden), b.prev)
        logits = logits.float()
        rows = torch.arange(len(b.before), device=b.before.device)[:, None, None]
        p_target = self.vocab.target_probs(batch.final[rows, b.before])
        ce = F.cross_entropy(logits.flatten(0, -2), b.labels.flatten(), reduction="none").view_as(b.labels)
        l1 = (logits.softmax(-1) - p_target).abs().sum(-1)
        accept = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
        bce = F.binary_cross_entropy_with_logits(confidence.float(), accept, reduction="none")
        loss = CE_WEIGHT * ce + L1_WEIGHT * l1 + CONFIDENCE_WEIGHT * bce
        return (loss * b.weights).sum() / b.weights.sum().clamp_min(1e-6)


class DSparkDrafter(DFlashDrafter):
    name = "dspark"
    model_cls = DSparkModel

    def _chain(self, hidden: torch.Tensor, ctx: DraftContext) -> DraftTree:
        """Draft position by position: Markov correction from the previous token, then the confidence cut."""
        base = self.model.logits(hidden)
        tokens: list[int] = []
        qs: list[torch.Tensor | None] = []
        scores: list[float] = []  # the confidence head's estimate of each draft's acceptance (1 without one)
        prev = ctx.tokens[-1]
        alive = 1.0  # the estimated probability that every draft so far is accepted
        state = None
        for k in range(len(hidden)):
            logits, confidence, state = self.model.step_heads(hidden[k], base[k], prev, state)
            logits = self.model.vocab.expand(logits)
            if confidence is not None:
                p = float(torch.sigmoid(confidence))
                alive = alive * p if self.options.confidence_rule == "cumulative" else p
                if alive < self.options.confidence_threshold:
                    break
            token, q = pick(logits[None], ctx)
            prev = token[0]
            tokens.append(int(prev))
            qs.extend(q)
            scores.append(alive)
            if not ctx.controller.keep_drafting(k + 1, logits):
                break
        tree = DraftTree.chain(tokens, self.name, qs)
        tree.scores = scores
        return tree


def _serving(o: DSparkOptions, controller: str, drafter: str | None) -> Serving:
    # vLLM runs DeepSpec's DSpark (its Markov head) at a fixed block; SGLang has DFlash only, so its
    # block of that length carries the draft length and nothing of DSpark's heads
    path = drafter or DRAFTER
    drafts = min(o.block_size, o.k_max - 1) if controller == "dspark" else o.block_size
    sglang = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", path,
              "--speculative-dflash-block-size", drafts + 1,
              "--speculative-dflash-draft-window-size", o.context_window]
    scheduler = tuple(knob_infos(SchedulerKnobs)) if controller == "dspark" else fixed_only(controller)
    return Serving({"method": "dspark", "model": path, "num_speculative_tokens": drafts}, sglang,
                   ("confidence_threshold", "confidence_rule", "context_window") + scheduler,
                   ("confidence_threshold", "confidence_rule", "the Markov and confidence heads") + scheduler)


STRATEGY = Method("dspark", DSparkOptions, DSparkDrafter.load, budget=lambda o: o.block_size,
                  short_draft=lambda n: {"block_size": n, "k_max": n + 1},
                  default_controller="dspark", trainable=DSparkModel.for_target, space=SPACE, serving=_serving,
                  vllm_drafter=True)
