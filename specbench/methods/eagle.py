"""EAGLE-3-style feature drafter (SafeAILab/EAGLE) with EAGLE-2's dynamic draft tree.

Architecture: the hidden states of a low, a middle and a high target layer are fused by a linear
layer 3H -> H. At every drafter row the fused feature and the target's embedding of the next token
are each RMS-normed, concatenated and projected 2H -> H, then pass one standard pre-norm decoder
block (RoPE attention over the drafter's own KV cache, a SwiGLU MLP of 2H, narrower than the
target's). The drafter's own RMSNorm and the target's frozen LM head turn the block output into
draft logits; deeper draft levels feed the block output back in place of the target feature, as
EAGLE does.

Rows: drafter row i pairs the target feature of position i with the embedding of token i + 1 and
predicts token i + 2, at position id i. With n committed tokens the target has features for
positions 0..n-2 (the last committed token is not in its cache yet), so the drafter's committed
rows are 0..n-2, and the output of row n-2 drafts the first level. A draft node at level d is row
n-2+d; it sees the committed rows, its ancestors and itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.kv_cache import state_bytes
from specbench.decoding.linear import Linear
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method, drafting_dtype, load_trained
from specbench.methods.draft_vocab import DraftVocab, draft_vocab_knob
from specbench.methods.layers import KV, Arch, FeatureLayer, causal_mask, embed
from specbench.methods.search_space import FloatRange, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.methods.serving import DRAFTER, Serving, fixed_only
from specbench.methods.trainable import DistillBatch


def feature_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high target layers as `output_hidden_states` indices (0 = embeddings, i = layer i)."""
    return tuple(sorted(min(max(i, 1), num_layers) for i in (2, num_layers // 2, num_layers - 2)))


@dataclass
class EagleOptions:
    depth: int = knob(5, "levels of the draft tree", "levels", low=1, high=32)
    top_k: int = knob(8, "children per expanded node, and nodes expanded per level", "nodes", low=1, high=64)
    total_tokens: int = knob(48, "draft nodes kept for verification (best cumulative log-prob)", "nodes",
                             low=1, high=1024)
    expand_above: float = knob(0.0, "draft a further level only while the best node's path probability "
                                    "exceeds it (0 = always, to the depth)", "probability", low=0, high=1)
    draft_vocab: int = draft_vocab_knob()
    ttt_steps: int = knob(3, "steps of EAGLE-3's training-time test when training (best as deep as it drafts)",
                          "levels", low=1, architecture=True)

    def __post_init__(self) -> None:
        check_ranges(self, "eagle.")


# EAGLE-2's tree settings around their defaults (depth 5, top-k 8, 48 nodes kept), down to chains and
# trees of a few nodes: where verifying 48 positions costs several forwards (a CPU), small trees pay; and
# down to one level of candidates, where each draft forward costs a tenth of the target's (a small target)
SPACE = SearchSpace((
    Param("depth", IntRange(1, 10)),
    Param("top_k", IntRange(1, 16)),
    Param("total_tokens", IntRange(2, 128, log=True)),
    Param("expand_above", FloatRange(0.0, 0.6)),
))


class EagleModel(nn.Module):
    """The trainable drafter: fusion layer + one feature layer; the target is held, not registered."""

    def __init__(self, target_model: nn.Module, arch: Arch, hidden_layers: tuple[int, ...], ttt_steps: int = 3,
                 draft_vocab: int | None = None):
        super().__init__()
        object.__setattr__(self, "target", target_model)
        self.arch = arch
        self.hidden_layers = tuple(hidden_layers)
        self.ttt_steps = ttt_steps
        self.fc = Linear(len(self.hidden_layers) * arch.hidden_size, arch.hidden_size, bias=False)
        self.layer = FeatureLayer(arch)
        self.vocab = DraftVocab(target_model, draft_vocab)

    @classmethod
    def for_target(cls, target, options: EagleOptions | None = None) -> EagleModel:
        """A fresh (random) drafter for `target`, on its device and in its dtype."""
        options = options or EagleOptions()
        config = target.model.config
        model = cls(target.model, Arch.drafter_block(config), feature_layers(config.num_hidden_layers),
                    options.ttt_steps, options.draft_vocab or None)
        return model.to(target.device, target.model.dtype)

    @classmethod
    def from_config(cls, target_model: nn.Module, config: dict) -> EagleModel:
        return cls(target_model, Arch(**config["arch"]), tuple(config["hidden_layers"]), config["ttt_steps"],
                   config.get("draft_vocab"))

    def drafter_config(self) -> dict:
        return {"arch": asdict(self.arch), "hidden_layers": list(self.hidden_layers), "ttt_steps": self.ttt_steps,
                "draft_vocab": None if self.vocab.full else self.vocab.size}

    def step(self, feature: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             past: KV | None = None) -> tuple[torch.Tensor, KV]:
        return self.layer(feature, embed(self.target, tokens), positions, mask, past)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary: draft id i is target id `draft_ids[i]`."""
        return self.vocab.compact(self.layer.out_norm(hidden))

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """The target id of each draft id; None where the draft vocabulary is the target's."""
        return None if self.vocab.full else self.vocab.ids

    def unroll(self, batch: DistillBatch) -> list[torch.Tensor]:
        """Block outputs (B, T - 1, H) of each of the `ttt_steps` steps of EAGLE-3's training-time test.

        Step 0 runs every row on the target features. At step s, row i takes the drafter's own
        output of row i - 1 at step s - 1 in place of the target feature: it stands for the
        level-(s+1) draft node below committed row i - s, and sees what that node sees when
        drafting: the step-0 rows up to i - s, one row of each later step (its ancestors), itself.
        """
        b, layers, length, h = batch.hidden.shape
        t = length - 1
        feature = self.fc(batch.hidden[:, :-1, :t].permute(0, 2, 1, 3).reshape(b, t, (layers - 1) * h))
        embeds = embed(self.target, batch.input_ids[:, 1:])
        positions = torch.arange(t, device=feature.device)
        rows, cols = positions[:, None], positions[None, :]
        past = None
        outs = []
        for s in range(self.ttt_steps):
            mask = torch.cat([cols <= rows - s] + [cols == rows - s + u for u in range(1, s + 1)], -1)
            out, past = self.layer(feature, embeds, positions, mask, past)
            outs.append(out)
            feature = torch.cat([out[:, :1], out[:, :-1]], 1)  # row 0 has no predecessor: filler, never scored
        return outs

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """Soft cross-entropy (forward KL up to a constant) against the target's distribution over the draft
        vocabulary, weighted 0.8^s over the unrolled steps."""
        with torch.no_grad():
            p = self.vocab.target_probs(batch.final[:, 1:])  # the target's view of token i + 2
        positions = torch.arange(p.shape[1], device=p.device)
        # row i predicts token i + 2: it is trained where that token is an answer's (the last row's token
        # lies past the sequence, its soft label is still the target's)
        answers = torch.cat([batch.mask[:, 2:], batch.mask[:, -1:]], 1)
        total = weights = 0.0
        for s, out in enumerate(self.unroll(batch)):
            ce = -(p * self.vocab.compact(self.layer.out_norm(out)).float().log_softmax(-1)).sum(-1)
            valid = (answers & (positions >= s)).float()
            total = total + 0.8 ** s * (ce * valid).sum() / valid.sum().clamp_min(1.0)
            weights += 0.8 ** s
        return total / weights


def eagle_tree(root_logits: torch.Tensor, expand: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
               depth: int, top_k: int, total_tokens: int, keep_drafting: Callable[[int, torch.Tensor], bool],
               name: str = "eagle", draft_ids: torch.Tensor | None = None, expand_above: float = 0.0) -> DraftTree:
    """EAGLE-2's dynamic draft tree.

    Level 1 holds the top_k tokens of `root_logits`. Each further level expands the top_k nodes of
    the level before (by cumulative log-prob): `expand(level, tokens, parents)` runs the drafter on
    those nodes (`parents` index the nodes expanded at the level before, or 0 for the root) and
    returns their logits; each contributes its top_k children. Of all candidates, the
    `total_tokens` best by cumulative log-prob are kept. They are emitted best first, which is a
    topological order: a child never scores above its parent, and on a tie the shallower node
    comes first (stable sort over candidates stored level by level).

    Drafting stops short of the depth where no candidate's path probability exceeds `expand_above`:
    a further level costs a drafter forward whatever it drafts, and below such a node it would draft
    tokens that are unlikely to be accepted.

    The logits are over a draft vocabulary whose id i is target id `draft_ids[i]` (None: the target's
    own ids): the tree is searched there, a few thousand columns rather than the target's whole
    vocabulary, and `expand` and the tree get target ids.
    """
    logits = root_logits[None]
    frontier_score = torch.zeros(1, device=logits.device)
    # the expanded nodes ("frontier"): their scores and candidate indices, the root (-1) first
    frontier_pool = torch.full((1,), -1, dtype=torch.long, device=logits.device)
    scores, tokens, parents = [], [], []
    size = 0
    for level in range(1, depth + 1):
        top = logits.float().log_softmax(-1).topk(min(top_k, logits.shape[-1]), -1)
        candidates = (frontier_score[:, None] + top.values).flatten()
        rows = torch.arange(len(logits), device=logits.device).repeat_interleave(top.values.shape[1])
        scores.append(candidates)
        tokens.append(top.indices.flatten() if draft_ids is None else draft_ids[top.indices.flatten()])
        parents.append(frontier_pool[rows])
        first, size = size, size + len(candidates)
        best = candidates.argmax()
        unlikely = expand_above > 0 and float(candidates[best]) <= math.log(expand_above)
        if level == depth or unlikely or not keep_drafting(level, logits[rows[best]]):
            break
        chosen = candidates.topk(min(top_k, len(candidates))).indices
        logits = expand(level, tokens[-1][chosen], rows[chosen])
        frontier_score, frontier_pool = candidates[chosen], first + chosen
    order = torch.argsort(-torch.cat(scores), stable=True)[:total_tokens].tolist()
    where = {c: i for i, c in enumerate(order)}
    tree = DraftTree()
    for token, parent in zip(torch.cat(tokens)[order].tolist(), torch.cat(parents)[order].tolist()):
        tree.add(token, where[parent] if parent >= 0 else -1, name)
    tree.scores = torch.cat(scores)[order].exp().tolist()  # path probabilities under the drafter
    return tree


class EagleDrafter(Drafter):
    name = "eagle"

    def __init__(self, model: EagleModel, options: EagleOptions):
        self.model = model.eval()
        self.options = options
        self.hidden_layers = model.hidden_layers
        self.kv: KV | None = None  # keys/values of the committed rows
        self.rows = 0  # how many
        self.last: torch.Tensor | None = None  # output of the last committed row
        self.pending: list[torch.Tensor] = []  # fused-layer inputs of rows not run yet

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        self.kv, self.rows, self.last = None, 0, None
        self.pending = [torch.cat(hidden, -1)] if len(prompt) > 1 else []

    def observe(self, outcome: StepOutcome) -> None:
        self.pending.append(torch.cat(outcome.hidden, -1))

    def state_bytes(self) -> int:
        return state_bytes(self.kv, self.pending)

    def _sync(self, tokens: torch.Tensor) -> None:
        """Run the committed rows not run yet (rows up to n - 2 for n committed tokens)."""
        if not self.pending:
            return
        features = torch.cat(self.pending)[:len(tokens) - 1 - self.rows]
        self.pending = []
        m = len(features)
        if m == 0:
            return
        positions = torch.arange(self.rows, self.rows + m, device=tokens.device)
        fused = self.model.fc(features.to(self.model.fc.weight.dtype))
        out, self.kv = self.model.step(fused[None], tokens[self.rows + 1:self.rows + 1 + m][None],
                                       positions, causal_mask(self.rows, m, tokens.device), self.kv)
        self.rows += m
        self.last = out[0, -1]

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.options.depth, ctx.budget)
        self._sync(ctx.tokens)
        if self.last is None or depth < 1:
            return DraftTree()
        model, device = self.model, ctx.tokens.device
        base = self.rows - 1  # row (and position) of the last committed row, the root
        # per node of the last expanded level: which of the nodes run so far it sees (its ancestors, itself)
        state = {"hidden": self.last[None], "sees": torch.zeros(1, 0, dtype=torch.bool, device=device),
                 "kv": self.kv}

        def expand(level: int, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            sees = torch.cat([state["sees"][parents], torch.eye(len(tokens), dtype=torch.bool, device=device)], -1)
            mask = torch.cat([sees.new_ones(len(tokens), self.rows), sees], -1)  # and every committed row
            positions = torch.full((len(tokens),), base + level, device=device)
            out, state["kv"] = model.step(state["hidden"][parents][None], tokens[None], positions, mask, state["kv"])
            state["sees"], state["hidden"] = sees, out[0]
            return model.logits(out[0])

        return eagle_tree(model.logits(self.last), expand, depth, self.options.top_k, self.options.total_tokens,
                          ctx.controller.keep_drafting, self.name, model.draft_ids, self.options.expand_above)


def _build(target, options: EagleOptions, drafter_dir: Path | None) -> EagleDrafter:
    return EagleDrafter(load_trained(target, "eagle", drafter_dir, lambda c: EagleModel.from_config(target.model, c),
                                     drafting_dtype(target)), options)


def _serving(o: EagleOptions, controller: str, drafter: str | None) -> Serving:
    # vLLM drafts EAGLE-3 as a chain of `depth` tokens; SGLang takes the EAGLE-2 tree settings (its
    # draft-token count includes the verified root)
    path = drafter or DRAFTER
    sglang = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", path,
              "--speculative-num-steps", o.depth, "--speculative-eagle-topk", o.top_k,
              "--speculative-num-draft-tokens", o.total_tokens + 1]
    # neither engine stops a tree short of its depth (expand_above)
    return Serving({"method": "eagle3", "model": path, "num_speculative_tokens": o.depth}, sglang,
                   ("top_k", "total_tokens", "expand_above") + fixed_only(controller),
                   ("expand_above",) + fixed_only(controller))


STRATEGY = Method("eagle", EagleOptions, _build, budget=lambda o: o.depth, default_controller="fixed",
                  short_draft=lambda n: {"depth": n, "total_tokens": n},
                  trainable=lambda target, options: EagleModel.for_target(target, options), space=SPACE, tree=True,
                  serving=_serving, vllm_drafter=True)
