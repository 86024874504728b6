"""One sequence, batch size 1: propose -> verify in one target forward -> accept -> commit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbench.engine.kv_cache import cache_length, keep_path, new_cache
from specbench.engine.protocol import Controller, DraftContext, Drafter, StepOutcome
from specbench.engine.sampling import Sampling
from specbench.engine.tree import DraftTree, tree_attention_mask
from specbench.engine.verify import accept_greedy, accept_sampling


@dataclass
class Generation:
    tokens: list[int]
    steps: int = 0  # target verify forwards
    drafted: int = 0  # draft positions reached: drafted, with every earlier position accepted
    accepted: int = 0  # draft tokens accepted
    verified: int = 0  # positions in the target's verify forwards (tree size + 1 per step)
    draft_depth: int = 0  # sum over steps of the proposed tree's depth
    accept_by_position: list[int] = field(default_factory=list)
    draft_by_position: list[int] = field(default_factory=list)  # reached at k: accept_by_position[k] / this = a_k
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    ttft_s: float = 0.0
    wall_s: float = 0.0
    stop_reason: str = "length"

    def record(self, path_length: int, reached_next: bool) -> None:
        for k in range(path_length + int(reached_next)):
            if k == len(self.draft_by_position):
                self.draft_by_position.append(0)
                self.accept_by_position.append(0)
            self.draft_by_position[k] += 1
            self.accept_by_position[k] += int(k < path_length)
        self.drafted += path_length + int(reached_next)
        self.accepted += path_length


class _Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _forward(target, tokens: torch.Tensor, cache, tree: DraftTree | None, layers: tuple[int, ...]):
    """Run the target over `tokens`; for a branching tree, with a tree mask and depth position ids."""
    position_ids = mask = None
    if tree is not None and not tree.is_chain():
        cached = cache_length(cache)
        depth = torch.tensor([0] + tree.depths(), device=tokens.device)
        position_ids = (depth + cached)[None]
        mask = tree_attention_mask(tree, cached, target.dtype, tokens.device)
    out = target(input_ids=tokens[None], cache=cache, use_cache=True, position_ids=position_ids,
                 attention_mask=mask, output_hidden_states=bool(layers))
    hidden = tuple(out.hidden_states[i][0] for i in layers) if layers else ()
    return out.logits[0], hidden


@torch.inference_mode()
def generate(target, prompt: list[int], max_new_tokens: int, sampling: Sampling = Sampling(),
             eos_ids: frozenset[int] = frozenset(), drafter: Drafter | None = None,
             controller: Controller | None = None, seed: int = 0) -> Generation:
    """Decode up to `max_new_tokens` after `prompt`; without a drafter this is plain decoding."""
    device = target.device
    clock = _Clock(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    layers = drafter.hidden_layers if drafter else ()
    committed = torch.tensor(prompt, dtype=torch.long, device=device)
    cache = new_cache(target.config)
    result = Generation(tokens=[])

    started = clock()
    hidden: tuple[torch.Tensor, ...] = tuple(torch.empty(0, device=device) for _ in layers)
    if len(prompt) > 1:
        _, hidden = _forward(target, committed[:-1], cache, None, layers)
    if drafter:
        drafter.start(committed, hidden)
    result.prefill_s = clock() - started

    while len(result.tokens) < max_new_tokens:
        t0 = clock()
        tree = DraftTree()
        if drafter:
            tree = drafter.propose(DraftContext(committed, controller.budget(), sampling, generator, controller))
        t1 = clock()
        cached = cache_length(cache)
        tokens = torch.tensor([int(committed[-1])] + tree.tokens, dtype=torch.long, device=device)
        logits, hidden = _forward(target, tokens, cache, tree, layers)
        t2 = clock()
        if sampling.greedy:
            path, bonus = accept_greedy(tree, logits)
        else:
            path, bonus = accept_sampling(tree, logits, sampling, generator)
        kept = [0] + [node + 1 for node in path]
        keep_path(cache, cached, kept)
        new = [tree.tokens[node] for node in path] + [bonus]
        new = new[:max_new_tokens - len(result.tokens)]
        eos_at = next((i for i, t in enumerate(new) if t in eos_ids), None)
        if eos_at is not None:
            new = new[:eos_at + 1]
            result.stop_reason = "eos"
        result.tokens.extend(new)
        committed = torch.cat([committed, torch.tensor(new, dtype=torch.long, device=device)])
        result.steps += 1
        result.verified += len(tokens)
        depth = max(tree.depths(), default=0)
        result.draft_depth += depth
        leaf = path[-1] + 1 if path else 0
        result.record(len(path), bool(tree.children()[leaf]))
        if drafter:
            kept_hidden = tuple(h[kept] for h in hidden)
            drafter.observe(StepOutcome(tree, path, bonus, new, kept_hidden))
            controller.update(depth, len(path))
        t3 = clock()
        result.draft_s += t1 - t0
        result.verify_s += t2 - t1
        result.other_s += t3 - t2
        if result.steps == 1:
            result.ttft_s = t3 - started
        if eos_at is not None:
            break
    result.wall_s = clock() - started
    return result
