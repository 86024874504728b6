"""DFlash (z-lab/dflash, arXiv 2602.06036): a block drafter that drafts B-1 tokens in one forward.

The block is [last committed token, MASK x (B-1)] at positions n-1 .. n+B-2. It attends to itself
bidirectionally and, in every draft layer, to keys/values projected from the target's hidden states
of the committed context: a few target layers concatenated and fused to the hidden size by a linear
layer (the context features). Slot k's output, through the target's own LM head, drafts the token
at position n-1+k, and the drafts are verified as a chain. Only the last `context_window` context
positions are kept (as projected keys/values per draft layer), which bounds the drafter's memory;
losslessness is untouched because the target verifies every draft.

Architecture as in z-lab's DFlashDraftModel (Qwen3-style layers, q/k RMSNorm, RoPE, keys/values of
context and block from the same projections, fc + RMSNorm over the context features, a final norm,
the target's embedding and LM head frozen). Deviations, each for a reason:
- MASK is a learned vector, not a reserved token of the target's vocabulary (none is free in an
  arbitrary target's vocabulary).
- Three context layers evenly spaced over layers 1 .. N-3 (DFlash's spacing rule, EAGLE-3's
  low/mid/high idea), independent of the number of draft layers (DFlash takes one per draft layer).
- Training samples block anchors whose first label is an answer token (DeepSpec also requires the
  anchor itself to be in the answer), so that the first block after the prompt is trained too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.flat import fuse
from specbench.decoding.kv_cache import state_bytes
from specbench.decoding.linear import Linear, linear
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method, drafting_dtype, load_trained
from specbench.methods.draft_vocab import DraftVocab, draft_vocab_knob
from specbench.methods.layers import Arch, embed, rope, rotate
from specbench.methods.search_space import Choice, IntRange, Param, SearchSpace, check_ranges, knob
from specbench.methods.serving import DRAFTER, Serving, fixed_only
from specbench.methods.trainable import DistillBatch

ANCHORS = 32  # blocks sampled per training sequence
CONTEXT_LAYERS = 3  # target layers concatenated into the context features


@dataclass
class DFlashOptions:
    block_size: int = knob(8, "B: the block of one forward, the last committed token plus B-1 drafts", "positions",
                           low=2)
    context_window: int = knob(512, "W: context positions the drafter sees (0 = all)", "tokens", low=0)
    layers: int = knob(2, "draft layers (used when training)", "layers", low=1, architecture=True)
    # DeepSpec's DFlash and DSpark configs
    gamma: float = knob(4.0, "training position weights exp(-k / gamma)", "positions", low=0, above=True,
                        architecture=True)
    draft_vocab: int = draft_vocab_knob()

    def __post_init__(self) -> None:
        check_ranges(self, "dflash.")


# DFlash's block around 8 (its published checkpoints use 8 and 16) and the drafter's window around 512
SPACE = SearchSpace((
    Param("controller", Choice(("fixed", "heuristic", "entropy"))),
    Param("block_size", IntRange(2, 16)),
    Param("context_window", IntRange(128, 2048, log=True)),
))


def context_layers(num_layers: int, count: int = CONTEXT_LAYERS) -> tuple[int, ...]:
    """HF hidden-state indices (i = output of decoder layer i) of `count` evenly spaced target layers."""
    lo, hi = (1, num_layers - 3) if num_layers > 4 else (0, num_layers - 1)
    ids = {round(lo + i * (hi - lo) / max(1, count - 1)) for i in range(count)}
    return tuple(sorted(i + 1 for i in ids))


@dataclass(frozen=True)
class BlockConfig:
    """The drafter's architecture, saved in its drafter directory."""

    arch: Arch  # each draft layer: the target's attention shape, an MLP of 2H
    vocab_size: int
    layers: int
    target_layers: tuple[int, ...]  # HF hidden-state indices of the context features
    shifted: bool = False  # DSpark: slot k drafts position n+k, so the anchor slot drafts too
    markov_rank: int = 0  # DSpark's Markov head
    draft_vocab: int | None = None  # tokens the drafter scores (None: the whole vocabulary)

    @classmethod
    def for_target(cls, model: nn.Module, options) -> BlockConfig:
        return cls(Arch.drafter_block(model.config), model.get_output_embeddings().weight.shape[0], options.layers,
                   context_layers(model.config.num_hidden_layers), draft_vocab=options.draft_vocab or None)

    @classmethod
    def from_dict(cls, values: dict) -> BlockConfig:
        return cls(**{**values, "arch": Arch(**values["arch"]), "target_layers": tuple(values["target_layers"])})


def batched_rope(positions: torch.Tensor, arch: Arch, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for positions (..., n), shaped (..., 1, n, head_dim) to broadcast over heads."""
    cos, sin = rope(positions.flatten(), arch.head_dim, arch.rope_theta, dtype)
    return cos.view(*positions.shape, -1).unsqueeze(-3), sin.view(*positions.shape, -1).unsqueeze(-3)


class DraftLayer(nn.Module):
    """A Qwen3-style decoder layer whose attention reads the context's keys/values before the block's."""

    def __init__(self, a: Arch):
        super().__init__()
        h, eps = a.hidden_size, a.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.q_proj = Linear(h, a.num_heads * a.head_dim, bias=False)
        self.k_proj = Linear(h, a.num_kv_heads * a.head_dim, bias=False)
        self.v_proj = Linear(h, a.num_kv_heads * a.head_dim, bias=False)
        self.o_proj = Linear(a.num_heads * a.head_dim, h, bias=False)
        self.q_norm = nn.RMSNorm(a.head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(a.head_dim, eps=eps)
        self.attn_norm = nn.RMSNorm(h, eps=eps)
        self.mlp_norm = nn.RMSNorm(h, eps=eps)
        self.gate_proj = Linear(h, a.intermediate_size, bias=False)
        self.up_proj = Linear(h, a.intermediate_size, bias=False)
        self.down_proj = Linear(a.intermediate_size, h, bias=False)

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q|k|v, its k|v rows, and gate|up each as one matrix: one product instead of three and two. Under
        autograd a concatenation (gradients reach the projections); at inference built once by flat.fuse,
        the projections' weights becoming views into it, and built again if they were replaced (`.to`).
        The same tensors at every call, so decoding/linear.py packs each once."""
        if torch.is_grad_enabled():
            qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            return qkv, qkv[self.heads * self.head_dim:], torch.cat([self.gate_proj.weight, self.up_proj.weight])
        fused = self.__dict__.get("_fused")
        if fused is None or fused[0].data_ptr() != self.q_proj.weight.data_ptr() \
                or fused[2].data_ptr() != self.gate_proj.weight.data_ptr():
            with torch.inference_mode(False):  # plain tensors: the weights stay trainable
                qkv = fuse(self.q_proj, self.k_proj, self.v_proj)[0]
                fused = qkv, qkv[self.heads * self.head_dim:], fuse(self.gate_proj, self.up_proj)[0]
            self.__dict__["_fused"] = fused
        return fused

    def _keys_values(self, k: torch.Tensor, v: torch.Tensor,
                     cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_norm(k.unflatten(-1, (self.kv_heads, self.head_dim))).transpose(-3, -2)
        return rotate(k, *cos_sin), v.unflatten(-1, (self.kv_heads, self.head_dim)).transpose(-3, -2)

    def kv(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of x (..., n, H), each (..., kv_heads, n, head_dim)."""
        kv = linear(x, self.fused_weights()[1])
        return self._keys_values(*kv.chunk(2, -1), cos_sin)

    def forward(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                context: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        qkv, _, gate_up = self.fused_weights()
        q, k, v = linear(self.attn_norm(x), qkv).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q = rotate(self.q_norm(q.unflatten(-1, (self.heads, self.head_dim))).transpose(-3, -2), *cos_sin)
        k, v = self._keys_values(k, v, cos_sin)
        k, v = torch.cat([context[0], k], -2), torch.cat([context[1], v], -2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        x = x + self.o_proj(out.transpose(-3, -2).flatten(-2))
        gate, up = linear(self.mlp_norm(x), gate_up).chunk(2, -1)
        return x + self.down_proj(F.silu(gate) * up)


@dataclass
class Blocks:
    """Training blocks, (batch, anchors, drafts, ...): what each draft slot saw and must predict."""

    hidden: torch.Tensor  # the drafter's final hidden state at each draft slot
    labels: torch.Tensor  # the target's token at that position
    prev: torch.Tensor  # the token before it (the anchor token for the first draft)
    before: torch.Tensor  # the position of that previous token: the target's prediction row for the label
    weights: torch.Tensor  # exp(-k / gamma) where the label is a supervised answer token, else 0


class DFlashModel(nn.Module):
    """The draft network. The target's embedding and LM head are used frozen and are not registered
    as submodules, so state_dict() holds only the drafter's own weights."""

    def __init__(self, target: nn.Module, config: BlockConfig, options):
        super().__init__()
        object.__setattr__(self, "target", target)  # held, not registered
        self.config = config
        self.options = options  # the knobs it was built with; training reads block_size, gamma, context_window
        hidden, eps = config.arch.hidden_size, config.arch.rms_norm_eps
        self.fc = Linear(len(config.target_layers) * hidden, hidden, bias=False)
        self.context_norm = nn.RMSNorm(hidden, eps=eps)
        self.mask_embedding = nn.Parameter(torch.randn(hidden) * 0.02)
        self.layers = nn.ModuleList(DraftLayer(config.arch) for _ in range(config.layers))
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.vocab = DraftVocab(target, config.draft_vocab)

    @classmethod
    def architecture(cls, model: nn.Module, options) -> BlockConfig:
        return BlockConfig.for_target(model, options)

    @classmethod
    def for_target(cls, target, options) -> DFlashModel:
        """A fresh, untrained drafter for `target` (the Method's `trainable`), on its device and in its dtype."""
        return cls(target.model, cls.architecture(target.model, options), options).to(target.device,
                                                                                      target.model.dtype)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.config.target_layers

    @property
    def first_draft_slot(self) -> int:
        return 0 if self.config.shifted else 1

    def drafter_config(self) -> dict:
        return {"architecture": dataclasses.asdict(self.config), "knobs": dataclasses.asdict(self.options)}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary; `vocab.expand` turns them into the target's."""
        return self.vocab.compact(hidden)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return batched_rope(positions, self.config.arch, self.fc.weight.dtype)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, keys/values of context features (..., m, L*H) at positions (..., m)."""
        context = self.context_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos_sin = self._rope(positions)
        return [layer.kv(context, cos_sin) for layer in self.layers]

    def token_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return embed(self.target, ids).to(self.fc.weight.dtype)

    def block_inputs(self, first: torch.Tensor, size: int) -> torch.Tensor:
        """Embeddings of blocks [first, MASK x (size-1)] for first token ids (..., A): (..., A*size, H)."""
        x = self.mask_embedding.expand(*first.shape, size, -1)
        return torch.cat([self.token_embeddings(first).unsqueeze(-2), x[..., 1:, :]], -2).flatten(-3, -2)

    def layer_masks(self, positions: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]],
                    mask: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Each draft layer's attention mask: `mask` for all of them (published checkpoints may window some)."""
        return [mask] * len(self.layers)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]],
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states of block inputs x (..., n, H) at positions (..., n)."""
        cos_sin = self._rope(positions)
        for layer, kv, layer_mask in zip(self.layers, context, self.layer_masks(positions, context, mask)):
            x = layer(x, cos_sin, kv, layer_mask)
        return self.norm(x)

    def sample_anchors(self, batch: DistillBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ANCHORS random block starts per sequence whose next token is an answer token; and which are real."""
        candidates = torch.zeros_like(batch.mask)
        candidates[:, :-1] = batch.mask[:, 1:]
        score = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, 2.0)
        order = score.argsort(-1)[:, :ANCHORS]
        return order, score.gather(1, order) < 2.0

    def blocks(self, batch: DistillBatch, anchors: torch.Tensor, keep: torch.Tensor) -> Blocks:
        """Run the blocks starting at `anchors` (batch, A) in one forward, each seeing the context before it."""
        ids, size, window = batch.input_ids, self.options.block_size, self.options.context_window
        rows, length = ids.shape
        count = anchors.shape[1]
        features = batch.hidden[:, :-1].permute(0, 2, 1, 3).flatten(2)  # (batch, T, L*H): context layers, in order
        context = self.context_kv(features, torch.arange(length, device=ids.device).expand(rows, -1))
        positions = (anchors[..., None] + torch.arange(size, device=ids.device)).flatten(1)  # (batch, A*B)
        start = anchors.repeat_interleave(size, 1)[..., None]  # each query's block start
        seen = torch.arange(length, device=ids.device)
        sees_context = (seen < start) & (seen >= start - window) if window else seen < start
        block = torch.arange(count * size, device=ids.device) // size
        sees_block = (block[:, None] == block[None, :]).expand(rows, -1, -1)
        mask = torch.cat([sees_context, sees_block], -1)[:, None]
        hidden = self(self.block_inputs(ids.gather(1, anchors), size), positions, context, mask)
        hidden = hidden.unflatten(1, (count, size))[:, :, self.first_draft_slot:]

        k = torch.arange(hidden.shape[2], device=ids.device)
        target_pos = anchors[..., None] + 1 + k
        inside = target_pos < length
        target_pos = target_pos.clamp(max=length - 1)
        tokens = ids.gather(1, target_pos.flatten(1)).view_as(target_pos)
        supervised = inside & batch.mask.gather(1, target_pos.flatten(1)).view_as(target_pos) & keep[..., None]
        supervised = supervised.int().cumprod(-1).bool()  # a block is trained up to its first unsupervised label
        prev = torch.cat([ids.gather(1, anchors)[..., None], tokens[..., :-1]], -1)
        labels, known = self.vocab.labels(tokens)  # a token outside the draft vocabulary is not a label
        weights = supervised * known * torch.exp(-k / self.options.gamma)
        return Blocks(hidden, labels, prev, target_pos - 1, weights)

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """Cross-entropy over the block against the target's own tokens, weighted exp(-k / gamma)."""
        b = self.blocks(batch, *self.sample_anchors(batch))
        ce = F.cross_entropy(self.logits(b.hidden).flatten(0, -2).float(), b.labels.flatten(), reduction="none")
        return (ce * b.weights.flatten()).sum() / b.weights.sum().clamp_min(1e-6)


def pick(logits: torch.Tensor, ctx: DraftContext) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One token per row of logits (n, V): argmax, or a sample with its q under ctx.sampling."""
    if ctx.sampling.greedy:
        return logits.argmax(-1), [None] * len(logits)
    q = ctx.sampling.probs(logits)
    return ctx.rng.draw_rows(q), list(q)


class DFlashDrafter(Drafter):
    name = "dflash"
    model_cls = DFlashModel
    parallel_draft = True  # the whole block in one forward (the --gpu projection costs it so)

    def __init__(self, model: DFlashModel, options):
        self.model = model
        self.options = options
        self.hidden_layers = model.config.target_layers
        self.context: list[tuple[torch.Tensor, torch.Tensor]] = []  # per draft layer, the window's keys/values
        self.pending: list[torch.Tensor] = []  # context features not projected yet
        self.seen = 0  # context positions absorbed so far

    @classmethod
    def untrained(cls, target, options, seed: int = 0) -> DFlashDrafter:
        """A randomly initialised drafter for any target (tests, smoke runs)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls.model_cls.for_target(target, options)
        return cls(model.eval(), options)

    @classmethod
    def load(cls, target, options, drafter_dir: Path | None) -> DFlashDrafter:
        """The trained drafter in `drafter_dir` (the embedded default's for the default target)."""
        model = load_trained(target, cls.name, drafter_dir,
                             lambda c: cls.model_cls(target.model, BlockConfig.from_dict(c["architecture"]), options),
                             drafting_dtype(target))
        return cls(model, options)

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        features = torch.cat(hidden, -1)
        self.pending = [features] if features.ndim == 2 and len(features) else []  # a 1-token prompt has none
        self.seen = 0
        arch = self.model.config.arch
        empty = torch.empty(1, arch.num_kv_heads, 0, arch.head_dim, device=prompt.device,
                            dtype=self.model.fc.weight.dtype)
        self.context = [(empty, empty)] * self.model.config.layers

    def observe(self, outcome: StepOutcome) -> None:
        self.pending.append(torch.cat(outcome.hidden, -1))

    def state_bytes(self) -> int:
        return state_bytes(self.context, self.pending)

    @property
    def max_depth(self) -> int:
        """Drafts one block holds: B - 1, or B where the anchor slot drafts too (DeepSpec's layout)."""
        return self.options.block_size - self.model.first_draft_slot

    def _absorb(self) -> None:
        """Project the new context features and append them to the window (drafting work, so done in propose)."""
        features = torch.cat(self.pending)
        self.pending = []
        window = self.options.context_window
        if window and len(features) > window:
            self.seen += len(features) - window
            features = features[-window:]
        positions = torch.arange(self.seen, self.seen + len(features), device=features.device)
        new = self.model.context_kv(features[None], positions[None])
        keep = slice(-window, None) if window else slice(None)
        self.context = [(torch.cat([k, nk], -2)[..., keep, :], torch.cat([v, nv], -2)[..., keep, :])
                        for (k, v), (nk, nv) in zip(self.context, new)]
        self.seen += len(features)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        size = self.options.block_size
        first = self.model.first_draft_slot
        depth = min(ctx.budget, self.max_depth)
        if depth < 1:
            return DraftTree()
        if self.pending:
            self._absorb()
        start = len(ctx.tokens) - 1  # the last committed token's position
        positions = torch.arange(start, start + size, device=ctx.tokens.device)[None]
        hidden = self.model(self.model.block_inputs(ctx.tokens[None, -1:], size), positions, self.context)
        return self._chain(hidden[0, first:first + depth], ctx)

    def _chain(self, hidden: torch.Tensor, ctx: DraftContext) -> DraftTree:
        """Every position drafted independently from the block's logits, cut where the controller says stop."""
        logits = self.model.vocab.expand(self.model.logits(hidden))
        tokens, qs = pick(logits, ctx)
        depth = next((k + 1 for k in range(len(logits)) if not ctx.controller.keep_drafting(k + 1, logits[k])),
                     len(logits))
        return DraftTree.chain(tokens[:depth].tolist(), self.name, qs[:depth])


def _serving(o: DFlashOptions, controller: str, drafter: str | None) -> Serving:
    path = drafter or DRAFTER
    sglang = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", path,
              "--speculative-dflash-block-size", o.block_size,
              "--speculative-dflash-draft-window-size", o.context_window]
    return Serving({"method": "dflash", "model": path, "num_speculative_tokens": o.block_size - 1}, sglang,
                   ("context_window",) + fixed_only(controller), fixed_only(controller))


STRATEGY = Method("dflash", DFlashOptions, DFlashDrafter.load, budget=lambda o: o.block_size - 1,
                  short_draft=lambda n: {"block_size": n + 1},
                  trainable=DFlashModel.for_target, space=SPACE, serving=_serving, vllm_drafter=True)
