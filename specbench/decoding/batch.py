"""B sequences in lockstep: every sequence proposes a chain, one batched target forward verifies them
all, each sequence accepts its own prefix.

Cache layout: batch row r holds its sequence's committed KV at positions [0, lengths[r]) (the cache
slot is the token's position); every slot after that, up to the cache's end, is dead: prompt
padding, rejected drafts, or slots another row used. Every query is masked from dead slots. A
step appends a block of 1 + max drafts slots to every row (the row's last committed token, its
drafts, padding), with position ids lengths[r] + j; then each row's kept slots (the root and its
accepted drafts) move down to follow its committed KV, and the cache is cut to its longest row.
A sequence that finishes (EOS, its max_new_tokens) leaves the batch: its row is dropped.

Greedy: every sequence decodes the tokens decode.generate gives it alone; sampling is exact per
sequence, with one Rng per sequence and the same verifier. A sequence's step is decode.generate's
(decode.propose, decode.accept, decode.settle): only the target forward and the compaction are
batched, so its drafter, controller and record see what they would alone. Drafters run per sequence, each its
own copy with its own state (`drafter_copies`): batching the drafters' forwards is left for later,
and the cost model counts drafting as B per-sequence proposals (bench/cost_timing.py measures it so).
Trees are refused: a batched tree mask is not built here (eagle, mtp and combinations run at batch
size 1).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from specbench.core.errors import SpecbenchError
from specbench.decoding.decode import Clock, Decoding, Generation, accept, propose, settle
from specbench.decoding.drafting import Controller, Drafter
from specbench.decoding.kv_cache import (
    cache_length,
    keep_rows,
    move_positions,
    new_cache,
    per_layer_type,
    run_model,
    truncate,
)
from specbench.decoding.sampling import Rng, Sampling, seeded
from specbench.decoding.tree import DraftTree


@dataclass
class BatchGeneration:
    sequences: list[Generation]  # per input sequence, in order: its tokens, counts, ttft_s and wall_s (its latency)
    steps: int = 0  # batched target verify forwards
    rows: int = 0  # sequence-rows over those forwards (sum of the batch size at each step)
    verified: int = 0  # positions in them, padding included (rows x block length, summed)
    prefill_s: float = 0.0
    wall_s: float = 0.0
    block_lengths: list[int] = field(default_factory=list)  # the verify block length of each step
    step_rows: list[int] = field(default_factory=list)  # per step: the sequences still in the batch
    step_tokens: list[int] = field(default_factory=list)  # per step: the tokens it committed over those rows
    step_times: list[tuple[float, float, float]] = field(default_factory=list)  # per step: draft, verify, other s

    @property
    def draft_s(self) -> float:
        """Every sequence's proposals, one after another."""
        return sum(t[0] for t in self.step_times)

    @property
    def verify_s(self) -> float:
        return sum(t[1] for t in self.step_times)

    @property
    def other_s(self) -> float:
        """Acceptance, compaction, commits and the drafters' observe."""
        return sum(t[2] for t in self.step_times)


def drafter_copies(drafter: Drafter, n: int) -> list[Drafter]:
    """One drafter per sequence, sharing the weights (a drafter's start() resets all its per-sequence state)."""
    return [copy.copy(drafter) for _ in range(n)]


def block_mask(config, lengths: torch.Tensor, cached: int, block_lengths: torch.Tensor, width: int,
               dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive masks (rows, 1, width, cached + width) for a block appended to every row.

    Query j of row r sees the row's committed slots [0, lengths[r]) and the block's slots up to j
    that are the row's own (below block_lengths[r]); with a sliding window only keys whose position
    is within the window of the query's.
    """
    device = lengths.device
    slot = torch.arange(cached + width, device=device)
    j = torch.arange(width, device=device)
    in_block = slot - cached
    committed = slot[None, None, :] < lengths[:, None, None]
    own = (in_block[None, None, :] <= j[None, :, None]) & (in_block[None, None, :] < block_lengths[:, None, None])
    visible = committed | ((in_block >= 0)[None, None, :] & own)
    query = lengths[:, None] + j[None, :]
    key = torch.where(slot[None, :] < cached, slot[None, :], lengths[:, None] + in_block[None, :])

    def build(window: int | None) -> torch.Tensor:
        seen = visible & (key[:, None, :] > query[:, :, None] - window) if window else visible
        mask = torch.zeros(seen.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]

    return per_layer_type(config, build)


def forward_block(target, blocks: list[torch.Tensor], lengths: torch.Tensor, cache, layers: tuple[int, ...],
                  logits_to_keep: int = 0) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run the target over one block of tokens per row (right-padded), appended after each row's
    committed KV. Returns logits (rows, width, V; the last `logits_to_keep` positions only, 0: all) and
    the requested hidden states (rows, width, H)."""
    tokens = pad_sequence(blocks, batch_first=True)
    block_lengths = torch.tensor([len(b) for b in blocks], device=tokens.device)
    positions = lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
    mask = block_mask(target.config, lengths, cache_length(cache), block_lengths, tokens.shape[1], target.dtype)
    out = run_model(target, cache, tokens, positions, mask, bool(layers), logits_to_keep)
    return out.logits, tuple(out.hidden_states[i] for i in layers) if layers else ()


def compact(cache, lengths: torch.Tensor, cached: int, kept: torch.Tensor) -> torch.Tensor:
    """Move each row's first kept[r] block slots to follow its committed KV; cut the cache to the
    longest row. Returns the new lengths."""
    rows = torch.repeat_interleave(torch.arange(len(kept), device=kept.device), kept)
    offset = torch.arange(int(kept.sum()), device=kept.device) - torch.repeat_interleave(kept.cumsum(0) - kept, kept)
    move_positions(cache, rows, cached + offset, lengths[rows] + offset)
    lengths = lengths + kept
    truncate(cache, int(lengths.max()))
    return lengths


@torch.inference_mode()
def generate_batch(target, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
                   sampling: Sampling = Sampling(), eos_ids: frozenset[int] = frozenset(),
                   drafters: Sequence[Drafter] | None = None, controllers: Sequence[Controller] | None = None,
                   rngs: Sequence[Rng] | None = None) -> BatchGeneration:
    """Decode every prompt in one batch; `drafters`, `controllers` and `rngs` are one per sequence
    (None: plain decoding; seeded(0) each, as decode.generate's default)."""
    count = len(prompts)
    limits = [max_new_tokens] * count if isinstance(max_new_tokens, int) else list(max_new_tokens)
    device = target.device
    clock = Clock(device)
    rngs = rngs if rngs is not None else [seeded(0, device) for _ in range(count)]
    layers = drafters[0].hidden_layers if drafters else ()
    seqs = [Decoding(torch.tensor(p, dtype=torch.long, device=device), limit, rng,
                     drafters[i] if drafters else None, controllers[i] if drafters else None)
            for i, (p, limit, rng) in enumerate(zip(prompts, limits, rngs))]
    cache = new_cache(target)
    result = BatchGeneration([seq.result for seq in seqs])

    started = clock()
    active = [seq for seq in seqs if seq.limit > 0]  # the sequence in each cache row
    lengths = torch.zeros(len(active), dtype=torch.long, device=device)  # committed KV per row
    heads = [seq.committed[:-1] for seq in active]
    hidden: tuple[torch.Tensor, ...] = tuple(torch.empty(len(active), 0, 0, device=device) for _ in layers)
    if any(len(h) for h in heads):
        # the prompts' logits are not needed: a batch of long prompts would hold rows x length x vocabulary
        _, hidden = forward_block(target, heads, lengths, cache, layers, logits_to_keep=1)
        lengths += torch.tensor([len(h) for h in heads], device=device)
    for row, seq in enumerate(active):
        if seq.drafter:
            seq.drafter.start(seq.committed, tuple(h[row, :len(heads[row])] for h in hidden))
    result.prefill_s = clock() - started

    while active:
        t0 = clock()
        drafts = [chain(seq, sampling) for seq in active]
        t1 = clock()
        cached = cache_length(cache)
        blocks = [torch.tensor([int(seq.committed[-1])] + tree.tokens, device=device)
                  for seq, (tree, _) in zip(active, drafts)]
        logits, hidden = forward_block(target, blocks, lengths, cache, layers)
        t2 = clock()
        paths = [accept(tree, logits[row, :len(tree) + 1], sampling, seq.rng)
                 for row, (seq, (tree, _)) in enumerate(zip(active, drafts))]
        kept = torch.tensor([len(path) + 1 for path, _ in paths], device=device)
        lengths = compact(cache, lengths, cached, kept)
        staying, step_tokens = [], 0
        for row, (seq, (tree, budget), (path, bonus)) in enumerate(zip(active, drafts, paths)):
            before = len(seq.result.tokens)
            if settle(seq, tree, budget, path, bonus, tuple(h[row, :len(path) + 1] for h in hidden),
                      logits[row, len(path)], eos_ids):
                seq.result.wall_s = clock() - started
                seq.result.drafter_state_bytes = seq.drafter.state_bytes() if seq.drafter else 0
            else:
                staying.append(row)
            step_tokens += len(seq.result.tokens) - before
        t3 = clock()
        for seq in active:
            seq.result.ttft_s = seq.result.ttft_s or t3 - started
        result.steps += 1
        result.rows += len(active)
        result.verified += len(active) * logits.shape[1]
        result.block_lengths.append(logits.shape[1])
        result.step_rows.append(len(active))
        result.step_tokens.append(step_tokens)
        result.step_times.append((t1 - t0, t2 - t1, t3 - t2))
        if len(staying) < len(active):
            keep = torch.tensor(staying, dtype=torch.long, device=device)
            keep_rows(cache, keep)
            lengths = lengths[keep]
            active = [active[row] for row in staying]
            if active:
                truncate(cache, int(lengths.max()))
    result.wall_s = clock() - started
    return result


def chain(seq: Decoding, sampling: Sampling) -> tuple[DraftTree, int]:
    """decode.propose, refusing a tree: a batch verifies chains only."""
    tree, budget = propose(seq, sampling)
    if not tree.is_chain():
        raise SpecbenchError(f"{seq.drafter.name} proposed a tree; batched decoding verifies chains only "
                             "(run tree strategies at batch size 1)")
    return tree, budget
