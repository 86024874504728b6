"""One sequence, batch size 1: propose -> verify in one target forward -> accept -> commit -> observe.

The step's pieces other than the target forward and the cache compaction (`propose`, `accept`,
`settle`) are the batch's too (decoding/batch.py), so a sequence's drafter, controller and record see
the same outcome whatever the batch size."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbench.decoding.drafting import Controller, DraftContext, Drafter, StepOutcome
from specbench.decoding.kv_cache import attention_masks, cache_length, keep_path, new_cache, run_model
from specbench.decoding.sampling import Rng, Sampling, seeded
from specbench.decoding.tree import DraftTree
from specbench.decoding.verify import accept_greedy, accept_sampling


@dataclass
class Generation:
    tokens: list[int]
    steps: int = 0  # target verify forwards
    drafts: int = 0  # verify forwards that carried at least one draft token
    drafted: int = 0  # draft tokens proposed: every node of every tree
    accepted: int = 0  # draft tokens accepted
    verified: int = 0  # positions in the target's verify forwards (tree size + 1 per step)
    max_verified: int = 0  # the largest verify forward
    draft_depth: int = 0  # sum over steps of the proposed tree's depth
    budget: int = 0  # sum over steps of the controller's draft budget
    tree_steps: int = 0  # steps whose draft branched (verified with a tree mask)
    accept_by_position: list[int] = field(default_factory=list)  # [k]: steps that accepted more than k drafts
    steps_by_drafted: list[int] = field(default_factory=list)  # [n]: steps whose draft tree had n nodes
    drafter_state_bytes: int = 0  # the drafter's per-sequence state (its caches) at the end
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    ttft_s: float = 0.0
    wall_s: float = 0.0
    stop_reason: str = "length"
    engine_log: list[str] = field(default_factory=list)  # what the engine logged of compiling or falling back meanwhile

    def record(self, tree: DraftTree, accepted: int, budget: int) -> None:
        self.steps += 1
        self.drafts += len(tree) > 0
        self.budget += budget
        self.tree_steps += not tree.is_chain()
        self.drafted += len(tree)
        self.accepted += accepted
        self.verified += len(tree) + 1
        self.max_verified = max(self.max_verified, len(tree) + 1)
        self.draft_depth += max(tree.depths(), default=0)
        self.accept_by_position += [0] * (accepted - len(self.accept_by_position))
        self.steps_by_drafted += [0] * (len(tree) + 1 - len(self.steps_by_drafted))
        self.steps_by_drafted[len(tree)] += 1
        for k in range(accepted):
            self.accept_by_position[k] += 1


class Clock:
    """Wall-clock seconds, synchronising CUDA first so that queued kernels are counted."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def forward(target, tokens: torch.Tensor, cache, tree: DraftTree | None,
            layers: tuple[int, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run the target over `tokens` (the root, then the tree's nodes); a branching tree gets a tree mask
    and depth position ids. Returns the logits and the requested hidden states, one row per token."""
    position_ids = mask = None
    if tree is not None and not tree.is_chain():
        cached = cache_length(cache)
        depth = torch.tensor([0] + tree.depths(), device=tokens.device)
        position_ids = (depth + cached)[None]
        mask = attention_masks(target.config, tree, cached, target.dtype, tokens.device)
    out = run_model(target, cache, tokens[None], position_ids, mask, bool(layers))
    hidden = tuple(out.hidden_states[i][0] for i in layers) if layers else ()
    return out.logits[0], hidden


def prefill(target, committed: torch.Tensor, cache, layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Fill the cache with every committed token but the last (the first step's root); its hidden states."""
    if len(committed) < 2:
        return tuple(torch.empty(0, device=committed.device) for _ in layers)
    return forward(target, committed[:-1], cache, None, layers)[1]


@dataclass
class Decoding:
    """One sequence being decoded, alone or in a batch: what it committed, what drafts for it, its record."""

    committed: torch.Tensor  # prompt and generated token ids; the last one is not in the target cache yet
    limit: int  # max_new_tokens
    rng: Rng
    drafter: Drafter | None = None
    controller: Controller | None = None
    result: Generation = field(default_factory=lambda: Generation(tokens=[]))


def propose(seq: Decoding, sampling: Sampling) -> tuple[DraftTree, int]:
    """The step's draft tree and the controller's budget for it (an empty tree and 0 without a drafter)."""
    if seq.drafter is None:
        return DraftTree(), 0
    budget = seq.controller.budget()
    return seq.drafter.propose(DraftContext(seq.committed, budget, sampling, seq.rng, seq.controller)), budget


def accept(tree: DraftTree, logits: torch.Tensor, sampling: Sampling, rng: Rng) -> tuple[list[int], int]:
    """The accepted path (node indices) and the bonus token, from the target's logits at the root and each node."""
    return accept_greedy(tree, logits) if sampling.greedy else accept_sampling(tree, logits, sampling, rng)


def commit(tree: DraftTree, path: list[int], bonus: int, room: int,
           eos_ids: frozenset[int]) -> tuple[list[int], bool]:
    """The tokens a step commits: the accepted drafts and the bonus, cut to `room` tokens and after
    the first EOS; and whether an EOS ended them."""
    new = ([tree.tokens[node] for node in path] + [bonus])[:room]
    eos_at = next((i for i, t in enumerate(new) if t in eos_ids), None)
    return (new, False) if eos_at is None else (new[:eos_at + 1], True)


def settle(seq: Decoding, tree: DraftTree, budget: int, path: list[int], bonus: int,
           hidden: tuple[torch.Tensor, ...], logits: torch.Tensor, eos_ids: frozenset[int]) -> bool:
    """After verification: commit the step's tokens, record the step, let the drafter and the controller
    learn from it (`hidden`: per layer, the target's hidden states of the root and the accepted nodes;
    `logits`: the target's at the row the bonus was drawn from).
    Returns whether the sequence is finished."""
    gen = seq.result
    new, eos = commit(tree, path, bonus, seq.limit - len(gen.tokens), eos_ids)
    gen.tokens.extend(new)
    seq.committed = torch.cat([seq.committed, torch.tensor(new, dtype=torch.long, device=seq.committed.device)])
    gen.record(tree, len(path), budget)
    if seq.drafter:
        seq.drafter.observe(StepOutcome(tree, path, bonus, new, hidden, logits))
        seq.controller.update(max(tree.depths(), default=0), len(path))
    if eos:
        gen.stop_reason = "eos"
    return eos or len(gen.tokens) >= seq.limit


@torch.inference_mode()
def generate(target, prompt: list[int], max_new_tokens: int, sampling: Sampling = Sampling(),
             eos_ids: frozenset[int] = frozenset(), drafter: Drafter | None = None,
             controller: Controller | None = None, seed: int = 0) -> Generation:
    """Decode up to `max_new_tokens` after `prompt`; without a drafter this is plain decoding."""
    device = target.device
    clock = Clock(device)
    layers = drafter.hidden_layers if drafter else ()
    seq = Decoding(torch.tensor(prompt, dtype=torch.long, device=device), max_new_tokens, seeded(seed, device),
                   drafter, controller)
    result = seq.result
    cache = new_cache(target)

    started = clock()
    hidden = prefill(target, seq.committed, cache, layers)
    if drafter:
        drafter.start(seq.committed, hidden)
    result.prefill_s = clock() - started

    done = max_new_tokens <= 0
    while not done:
        t0 = clock()
        tree, budget = propose(seq, sampling)
        t1 = clock()
        cached = cache_length(cache)
        tokens = torch.tensor([int(seq.committed[-1])] + tree.tokens, dtype=torch.long, device=device)
        logits, hidden = forward(target, tokens, cache, tree, layers)
        t2 = clock()
        path, bonus = accept(tree, logits, sampling, seq.rng)
        kept = [0] + [node + 1 for node in path]
        keep_path(cache, cached, kept)
        done = settle(seq, tree, budget, path, bonus, tuple(h[kept] for h in hidden), logits[kept[-1]], eos_ids)
        t3 = clock()
        result.draft_s += t1 - t0
        result.verify_s += t2 - t1
        result.other_s += t3 - t2
        if result.steps == 1:
            result.ttft_s = t3 - started
    result.wall_s = clock() - started
    if drafter:
        result.drafter_state_bytes = drafter.state_bytes()
    return result
