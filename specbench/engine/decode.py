"""One sequence, batch size 1: propose -> verify in one target forward -> accept -> commit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbench.engine.kv_cache import attention_masks, cache_length, keep_path, new_cache, run_model
from specbench.engine.protocol import Controller, DraftContext, Drafter, StepOutcome
from specbench.engine.sampling import Rng, Sampling, seeded
from specbench.engine.tree import DraftTree
from specbench.engine.verify import accept_greedy, accept_sampling


@dataclass
class Generation:
    tokens: list[int]
    steps: int = 0  # target verify forwards
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

    def record(self, tree: DraftTree, accepted: int, budget: int) -> None:
        self.steps += 1
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


def accept(tree: DraftTree, logits: torch.Tensor, cache, cached: int, sampling: Sampling,
           rng: Rng) -> tuple[list[int], int]:
    """The accepted path and the bonus token; the cache is compacted to root + path."""
    path, bonus = accept_greedy(tree, logits) if sampling.greedy else accept_sampling(tree, logits, sampling, rng)
    keep_path(cache, cached, [0] + [node + 1 for node in path])
    return path, bonus


def commit(tree: DraftTree, path: list[int], bonus: int, room: int,
           eos_ids: frozenset[int]) -> tuple[list[int], bool]:
    """The tokens a step commits: the accepted drafts and the bonus, cut to `room` tokens and after
    the first EOS; and whether an EOS ended them."""
    new = ([tree.tokens[node] for node in path] + [bonus])[:room]
    eos_at = next((i for i, t in enumerate(new) if t in eos_ids), None)
    return (new, False) if eos_at is None else (new[:eos_at + 1], True)


@torch.inference_mode()
def generate(target, prompt: list[int], max_new_tokens: int, sampling: Sampling = Sampling(),
             eos_ids: frozenset[int] = frozenset(), drafter: Drafter | None = None,
             controller: Controller | None = None, seed: int = 0) -> Generation:
    """Decode up to `max_new_tokens` after `prompt`; without a drafter this is plain decoding."""
    device = target.device
    clock = Clock(device)
    rng = seeded(seed, device)
    layers = drafter.hidden_layers if drafter else ()
    committed = torch.tensor(prompt, dtype=torch.long, device=device)
    cache = new_cache(target)
    result = Generation(tokens=[])

    started = clock()
    hidden = prefill(target, committed, cache, layers)
    if drafter:
        drafter.start(committed, hidden)
    result.prefill_s = clock() - started

    while len(result.tokens) < max_new_tokens:
        t0 = clock()
        tree, budget = DraftTree(), controller.budget() if drafter else 0
        if drafter:
            tree = drafter.propose(DraftContext(committed, budget, sampling, rng, controller))
        t1 = clock()
        cached = cache_length(cache)
        tokens = torch.tensor([int(committed[-1])] + tree.tokens, dtype=torch.long, device=device)
        logits, hidden = forward(target, tokens, cache, tree, layers)
        t2 = clock()
        path, bonus = accept(tree, logits, cache, cached, sampling, rng)
        new, eos = commit(tree, path, bonus, max_new_tokens - len(result.tokens), eos_ids)
        if eos:
            result.stop_reason = "eos"
        result.tokens.extend(new)
        committed = torch.cat([committed, torch.tensor(new, dtype=torch.long, device=device)])
        result.record(tree, len(path), budget)
        if drafter:
            kept = [0] + [node + 1 for node in path]
            drafter.observe(StepOutcome(tree, path, bonus, new, tuple(h[kept] for h in hidden)))
            controller.update(max(tree.depths(), default=0), len(path))
        t3 = clock()
        result.draft_s += t1 - t0
        result.verify_s += t2 - t1
        result.other_s += t3 - t2
        if result.steps == 1:
            result.ttft_s = t3 - started
        if eos:
            break
    result.wall_s = clock() - started
    if drafter:
        result.drafter_state_bytes = drafter.state_bytes()
    return result
