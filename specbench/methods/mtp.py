"""Multi-token prediction modules, DeepSeek-V3 style, chained into a pruned candidate tree.

Module k takes RMSNorm(embedding of token t + k) and RMSNorm(previous hidden: the target's last
(normed) hidden state at t for k = 1, module k-1's output at t after), concatenates them,
projects 2H -> H, runs one decoder block and predicts token t + k + 1 through its own RMSNorm and
the target's frozen LM head (the same `FeatureLayer` as EAGLE's, one per module).

Rows: module k's row t embeds token t + k, at position id t. Each module attends over its own KV
cache. With n committed tokens, drafting runs every module at row n - 2 (the last position with a
target hidden state); module k's committed rows are those whose inputs are all committed, t up to
n - 1 - k, so at row t it sees rows up to t - (k - 1) and itself. Training uses the same mask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.drafting import DraftContext, Drafter, StepOutcome
from specbench.decoding.kv_cache import state_bytes
from specbench.decoding.tree import DraftTree
from specbench.methods.base import Method, drafting_dtype, load_trained
from specbench.methods.controllers import entropy
from specbench.methods.draft_vocab import DraftVocab, draft_vocab_knob
from specbench.methods.layers import KV, Arch, FeatureLayer, embed
from specbench.methods.search_space import Choice, FloatRange, IntRange, Param, Ref, SearchSpace, check_ranges, knob
from specbench.methods.serving import Serving, fixed_only
from specbench.methods.trainable import DistillBatch


def parse_branching(text: str) -> tuple[int, ...]:
    """"3,2" -> (3, 2): children per node at level 1, 2, ...; the last width repeats below."""
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise SpecbenchError(f"mtp.branching: expected comma-separated integers like 3,2, got {text!r}") from None
    if not widths or min(widths) < 1:
        raise SpecbenchError(f"mtp.branching: every width must be at least 1, got {text!r}")
    return widths


@dataclass
class MtpOptions:
    n_modules: int = knob(3, "MTP modules used: the tree's maximum depth", "modules", low=1, high=16)
    # the EAGLE/MTP/DFlash/DSpark practitioners' comparison: top-3, then top-2; a tuple is accepted
    branching: str = knob("3,2", "children per node by level; the last width repeats below", "nodes per level")
    entropy_threshold: float = knob(2.1, "a node whose draft entropy exceeds it gets no children", "nats", low=0)
    draft_vocab: int = draft_vocab_knob()

    def __post_init__(self) -> None:
        if isinstance(self.branching, (tuple, list)):
            self.branching = ",".join(str(w) for w in self.branching)
        parse_branching(self.branching)
        check_ranges(self, "mtp.")

    @property
    def widths(self) -> tuple[int, ...]:
        return parse_branching(self.branching)


def module_mask(module: int, first: int, rows: int, device: torch.device) -> torch.Tensor:
    """(rows, first + rows) bool for rows first..: row t sees rows up to t - (module - 1), and itself."""
    t = torch.arange(first, first + rows, device=device)[:, None]
    s = torch.arange(first + rows, device=device)[None]
    return (s <= t - module + 1) | (s == t)


class MtpModel(nn.Module):
    """The trainable modules; the target is held, not registered."""

    def __init__(self, target_model: nn.Module, arch: Arch, n_modules: int, hidden_layer: int,
                 draft_vocab: int | None = None):
        super().__init__()
        object.__setattr__(self, "target", target_model)
        self.arch = arch
        self.hidden_layers = (hidden_layer,)
        self.layers = nn.ModuleList(FeatureLayer(arch) for _ in range(n_modules))
        self.vocab = DraftVocab(target_model, draft_vocab)

    @classmethod
    def for_target(cls, target, options: MtpOptions) -> MtpModel:
        """Fresh (random) modules for `target`, on its device and in its dtype."""
        config = target.model.config
        model = cls(target.model, Arch.drafter_block(config), options.n_modules, config.num_hidden_layers,
                    options.draft_vocab or None)
        return model.to(target.device, target.model.dtype)

    @classmethod
    def from_config(cls, target_model: nn.Module, config: dict) -> MtpModel:
        return cls(target_model, Arch(**config["arch"]), config["n_modules"], config["hidden_layers"][0],
                   config.get("draft_vocab"))

    def drafter_config(self) -> dict:
        return {"arch": asdict(self.arch), "n_modules": len(self.layers), "hidden_layers": list(self.hidden_layers),
                "draft_vocab": None if self.vocab.full else self.vocab.size}

    def logits(self, module: int, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits of module `module` (0-based) from its output."""
        return self.vocab.logits(self.layers[module].out_norm(hidden))

    def unroll(self, batch: DistillBatch) -> list[torch.Tensor]:
        """Each module's outputs, chained: module k's row t (of T - k) embeds token t + k."""
        ids = batch.input_ids
        hidden = batch.hidden[:, 0]
        outs = []
        for k, layer in enumerate(self.layers, 1):
            rows = ids.shape[1] - k
            if rows < 1:
                break
            positions = torch.arange(rows, device=ids.device)
            hidden, _ = layer(hidden[:, :rows], embed(self.target, ids[:, k:]), positions,
                              module_mask(k, 0, rows, ids.device))
            outs.append(hidden)
        return outs

    def training_loss(self, batch: DistillBatch) -> torch.Tensor:
        """Mean over modules of the cross-entropy of module k on token t + k + 1 (the target's own tokens),
        over the draft vocabulary: a token outside it is not a label."""
        ids = batch.input_ids
        losses = []
        for k, hidden in enumerate(self.unroll(batch), 1):
            if hidden.shape[1] < 2:
                break
            logits = self.vocab.compact(self.layers[k - 1].out_norm(hidden[:, :-1])).float()
            labels, known = self.vocab.labels(ids[:, k + 1:])
            ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
            weight = (batch.mask[:, k + 1:] & known).flatten().float()
            losses.append((ce * weight).sum() / weight.sum().clamp_min(1.0))
        return torch.stack(losses).mean()


def mtp_tree(root_logits: torch.Tensor, expand: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
             widths: tuple[int, ...], depth: int, threshold: float,
             keep_drafting: Callable[[int, torch.Tensor], bool], name: str = "mtp") -> DraftTree:
    """The candidate tree, level by level (breadth first, children best first).

    Level 1 is always proposed: the top widths[0] tokens of `root_logits`. `expand(level, tokens,
    parents)` runs the next module on the nodes of `level` (`parents` index the nodes of the level
    before, 0 for the root) and returns their logits; a node then gets its top widths[level]
    children only where the entropy of those logits is at most `threshold`.
    """
    tree = DraftTree()
    logits = root_logits[None]
    ids = [-1]
    for level in range(1, depth + 1):
        width = min(widths[min(level, len(widths)) - 1], logits.shape[-1])
        if level == 1:
            rows = torch.zeros(1, dtype=torch.long, device=logits.device)
        else:
            rows = (entropy(logits) <= threshold).nonzero().flatten()
            if not len(rows):
                break
        tokens = logits[rows].topk(width, -1).indices.flatten()
        parents = rows.repeat_interleave(width)
        new = [tree.add(t, ids[p], name) for t, p in zip(tokens.tolist(), parents.tolist())]
        if level == depth or not keep_drafting(level, logits[rows[0]]):
            break
        logits = expand(level, tokens, parents)
        ids = new
    return tree


class MtpDrafter(Drafter):
    name = "mtp"

    def __init__(self, model: MtpModel, options: MtpOptions):
        if options.n_modules > len(model.layers):
            raise SpecbenchError(f"mtp.n_modules={options.n_modules}, but the drafter has "
                                 f"{len(model.layers)} trained modules")
        self.model = model.eval()
        self.options = options
        self.hidden_layers = model.hidden_layers
        self.out: list[torch.Tensor] = []  # [target hidden, module 1 outputs, ...]: one row per committed row
        self.kv: list[KV | None] = []  # per module: keys/values of its committed rows

    def start(self, prompt: torch.Tensor, hidden: tuple[torch.Tensor, ...]) -> None:
        h = self.model.arch.hidden_size
        p = next(self.model.parameters())
        empty = torch.empty(0, h, dtype=p.dtype, device=p.device)
        self.out = [hidden[0] if len(prompt) > 1 else empty] + [empty] * len(self.model.layers)
        self.kv = [None] * len(self.model.layers)

    def observe(self, outcome: StepOutcome) -> None:
        self.out[0] = torch.cat([self.out[0], outcome.hidden[0]])

    def state_bytes(self) -> int:
        return state_bytes(self.kv, self.out)

    def _module(self, k: int, tokens: torch.Tensor, candidates: tuple[torch.Tensor, torch.Tensor] | None = None,
                row: int = 0) -> torch.Tensor:
        """Run module k over its committed rows not run yet (their outputs and keys/values kept) and, in the
        same forward (one pass over the module's weights), over `candidates` (hidden, token ids) at `row`,
        which see the committed rows and themselves and are not kept. Returns the candidates' outputs."""
        device = tokens.device
        first, end = len(self.out[k]), min(len(self.out[k - 1]), len(tokens) - k)
        m, c = max(end - first, 0), 0 if candidates is None else len(candidates[1])
        if m + c == 0:
            return self.out[k][:0]
        hidden, ids = self.out[k - 1][first:first + m], tokens[first + k:first + k + m]
        positions = torch.arange(first, first + m, device=device)
        mask = module_mask(k, first, m, device)
        if candidates is not None:
            hidden, ids = torch.cat([hidden, candidates[0]]), torch.cat([ids, candidates[1]])
            positions = torch.cat([positions, torch.full((c,), row, device=device)])
            mask = torch.cat([torch.cat([mask, mask.new_zeros(m, c)], -1),
                              torch.cat([mask.new_ones(c, first + m), torch.eye(c, dtype=torch.bool, device=device)],
                                        -1)])
        out, kv = self.model.layers[k - 1](hidden[None], embed(self.model.target, ids)[None], positions, mask,
                                           self.kv[k - 1])
        if m:
            self.kv[k - 1] = (kv[0][:, :, :first + m], kv[1][:, :, :first + m])
            self.out[k] = torch.cat([self.out[k], out[0, :m]])
        return out[0, m:]

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.options.n_modules, ctx.budget)
        if depth < 1:
            return DraftTree()
        self._module(1, ctx.tokens)  # the later modules catch up when they expand a level
        row = len(ctx.tokens) - 2
        if row < 0 or len(self.out[1]) <= row:
            return DraftTree()
        model = self.model
        state = {"hidden": self.out[1][row][None]}

        def expand(level: int, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            # module level + 1 at `row`: sees its committed rows and itself, not the sibling candidates
            state["hidden"] = self._module(level + 1, ctx.tokens, (state["hidden"][parents], tokens), row)
            return model.logits(level, state["hidden"])

        return mtp_tree(model.logits(0, self.out[1][row]), expand, self.options.widths, depth,
                        self.options.entropy_threshold, ctx.controller.keep_drafting, self.name)


def _build(target, options: MtpOptions, drafter_dir: Path | None) -> MtpDrafter:
    return MtpDrafter(load_trained(target, "mtp", drafter_dir, lambda c: MtpModel.from_config(target.model, c),
                                   drafting_dtype(target)), options)


# around the EAGLE/MTP/DFlash/DSpark practitioners' comparison's tree (top-3 then top-2, 2.1 nats), down to
# a chain ("1"), and up to 16 nats, above any vocabulary's entropy (ln 49,152 = 10.8): nothing is cut; at most
# as many modules as the drafter was trained with
SPACE = SearchSpace((
    Param("n_modules", IntRange(1, Ref("trained_modules"))),
    Param("branching", Choice(("3,2", "1", "2", "3", "2,1", "3,1", "2,2", "4,2", "3,3", "4,3"))),
    Param("entropy_threshold", FloatRange(0.5, 16.0, log=True)),
))

def _tree_size(o: MtpOptions) -> int:
    widths = [int(w) for w in o.branching.split(",")]
    size, level = 0, 1
    for depth in range(o.n_modules):
        level *= widths[min(depth, len(widths) - 1)]
        size += level
    return size


def _serving(o: MtpOptions, controller: str, drafter: str | None) -> Serving:
    # the target's own MTP layers in both engines: SGLang runs them as EAGLE with a tree, vLLM as a chain
    sglang = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", o.n_modules,
              "--speculative-eagle-topk", int(o.branching.split(",")[0]),
              "--speculative-num-draft-tokens", _tree_size(o) + 1]
    return Serving({"method": "mtp", "num_speculative_tokens": o.n_modules}, sglang,
                   ("branching", "entropy_threshold") + fixed_only(controller),
                   ("entropy_threshold", "branching below level 1") + fixed_only(controller))


STRATEGY = Method("mtp", MtpOptions, _build, budget=lambda o: o.n_modules, default_controller="fixed",
                  short_draft=lambda n: {"n_modules": min(n, 3), "branching": "1"},
                  trainable=lambda target, options: MtpModel.for_target(target, options), space=SPACE,
                  limits=lambda drafter: {"trained_modules": len(drafter.model.layers)}, tree=True,
                  serving=_serving,
                  no_vllm_drafter="vLLM's MTP runs the MTP layers of the target's own checkpoint; specbench's "
                                  "separate MTP modules have no vLLM counterpart",
                  vllm_only_from="MTP layers inside the target's own checkpoint (DeepSeek-V3, Qwen3-Next, MiMo)")
