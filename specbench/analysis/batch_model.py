"""Modelled speedup at any batch size: acceptance and draft shape from a run, costs from the cost table.

Per sequence a strategy commits tau = 1 + sum_k prod_{i<=k} a_i tokens per step (Leviathan et al.
§3, cost_model.expected_tau), a_k the acceptance at draft position k given the one before it. Acceptance belongs to the
drafter and the text, not to the load; what the load changes is the cost of a step. In the batched
engine (decoding/batch.py) a step of B sequences costs

    T(B) = T_target(B, n_B, c) + B x T_propose + T_overhead(B, n_B)

with n_B the verify block, 1 + the most drafts any of the B sequences proposed (shorter chains are
padded to it): its expectation over B independent steps follows from the distribution of draft
sizes the run measured. Drafters run per sequence, hence B proposals, each priced at the run's mean
draft budget (as cost_model prices it: a drafter that cuts its draft short by confidence has
computed the budget's block all the same). Plain decoding costs
T_target(B, 1, c) + T_overhead(B, 1) per step for one token per sequence, so the modelled speedup
is tau x T_ar(B) / T(B) while every row is busy. Tree strategies get the tree mask's costs; the
engine verifies them at batch 1 only, so above it their figures are modelled, never measured.

A batch does not stay full: the engine runs static batches, and a sequence leaves when it is done.
Under speculation sequences finish at different steps (each at its own acceptance), so the batch
drains: its last steps run a few rows, each priced at T(r) for the r rows still active (the table
interpolated between its batch sizes), which costs more per row than T(B) / B. Plain decoding's
sequences finish together unless one stops at an EOS. A sequence's steps and tokens do not depend
on the batch it runs in (it decodes what it decodes alone), so the run's batch-1 rows give, at any
B, the steps by active rows of both (`drain`, in groups of B in the run's order), and the modelled
speedup is the ratio of the two summed costs for the same tokens. A shape without its sequences
prices a batch that never empties, as a serving engine's continuous batching at a fixed
concurrency keeps it: the load axis reports that figure beside the drained one.

analysis/cost_model.py predicts batch size 1 from the forwards alone, leaving the engine's overhead
out on purpose (its measured / predicted shows that overhead); this model is the batch axis, and
counts what grows with B: B proposals, the padding to the longest draft, the per-row bookkeeping.

A draft cap K (at most K drafts per step, `draft_tokens` in a run's draft schedule) cuts tau to
its first K positions and the draft sizes at K; the best cap per batch size maximises modelled
throughput, 0 meaning plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbench.analysis.cost_model import expected_tau
from specbench.analysis.cost_table import CostTable
from specbench.core.errors import SpecbenchError


@dataclass(frozen=True)
class DraftShape:
    """What a run measured of one strategy, per sequence and step: independent of the batch size."""

    acceptance: tuple[float, ...]  # a_k, k = 1, 2, ...
    drafted: tuple[float, ...]  # [n]: the share of steps that drafted n tokens (tree nodes)
    context: float  # mean context length of a step (prompt plus half the answer)
    drafter: str | None  # the drafter's key in the cost table; None for plain decoding
    budget: float  # the controller's mean draft budget per step: what a proposal's cost depends on
    tree: bool = False  # verified as a token tree
    # per sequence, in the run's order: (its steps, its tokens); () prices a batch that never empties
    sequences: tuple[tuple[int, int], ...] = ()

    @classmethod
    def measured(cls, acceptance: Sequence[float], steps_by_drafted: Sequence[float], context: float,
                 drafter: str | None, budget: float, tree: bool = False,
                 sequences: Sequence[tuple[int, int]] = ()) -> DraftShape:
        counts = np.asarray(steps_by_drafted, dtype=float)
        if counts.sum() <= 0:
            raise SpecbenchError("a draft shape needs at least one measured step")
        return cls(tuple(float(a) for a in acceptance), tuple(counts / counts.sum()), float(context), drafter,
                   float(budget), tree, tuple((int(n), int(t)) for n, t in sequences))

    @property
    def max_drafted(self) -> int:
        return len(self.drafted) - 1

    def capped(self, cap: int | None) -> tuple[float, ...]:
        """The draft-size distribution when at most `cap` tokens are drafted per step."""
        if cap is None or cap >= self.max_drafted:
            return self.drafted
        return self.drafted[:cap] + (sum(self.drafted[cap:]),)


def tau(shape: DraftShape, cap: int | None = None) -> float:
    """Tokens committed per step per sequence, the bonus token included."""
    return expected_tau(shape.acceptance, cap)


def expected_block(drafted: Sequence[float], batch: int) -> float:
    """1 + E[the largest of `batch` independent draft sizes]: the padded verify block's length."""
    below = np.cumsum(drafted)[:-1]  # P(size <= n), n = 0 .. max - 1
    return 1.0 + float(np.sum(1.0 - np.clip(below, 0.0, 1.0) ** batch))


def step_cost(table: CostTable, shape: DraftShape, batch: int, cap: int | None = None) -> dict[str, float]:
    """Seconds of one step of `batch` sequences, split as verify, draft and overhead."""
    drafted = shape.capped(cap)
    block = expected_block(drafted, batch) if shape.drafter else 1.0
    verify = table.target_s(block, shape.context, batch, tree=shape.tree)
    draft = 0.0
    budget = shape.budget if cap is None else min(shape.budget, cap)
    if shape.drafter and budget > 0:
        if shape.drafter not in table.drafters:
            raise SpecbenchError(f"the cost table has no proposal costs for {shape.drafter.split(':')[0]} "
                                 "with these knobs; time them with `specbench costs`")
        draft = batch * table.drafter_s(shape.drafter, max(1.0, budget))
    overhead = table.overhead_s(block, batch)
    return {"block": block, "verify_s": verify, "draft_s": draft, "overhead_s": overhead,
            "step_s": verify + draft + overhead}


def drain(lengths: Sequence[int], batch: int) -> dict[int, int]:
    """{r: batched steps run with r sequences active} when consecutive groups of `batch` sequences, of
    these step counts, run as the engine's static batches: a finished sequence leaves, none joins."""
    occupancy: dict[int, int] = {}
    for start in range(0, len(lengths), batch):
        group = sorted(lengths[start:start + batch], reverse=True) + [0]
        for rows in range(1, len(group)):
            if group[rows - 1] > group[rows]:
                occupancy[rows] = occupancy.get(rows, 0) + group[rows - 1] - group[rows]
    return occupancy


def occupancies(shape: DraftShape, batch: int, cap: int | None) -> tuple[dict[int, float], dict[int, float], float]:
    """The steps by active rows of the strategy and of plain decoding, and the tokens they commit.

    With the run's sequences: their step counts drained in groups of `batch` (the rows still active
    shrink as sequences finish at different steps; plain decoding's steps are the tokens). Under a cap
    a sequence's steps scale by tau / tau(cap). Without sequences: one step of a full batch, committing
    tau per row, against tau steps of plain decoding (continuous batching at a fixed concurrency)."""
    committed = tau(shape, cap) if shape.drafter else 1.0
    if not shape.sequences:
        return {batch: 1.0}, {batch: committed}, batch * committed
    tokens = [t for _, t in shape.sequences]
    if shape.drafter and cap != 0:
        scale = tau(shape) / committed
        steps = [min(t, max(1, round(n * scale))) for n, t in shape.sequences]
    else:
        steps = tokens
    return ({r: float(n) for r, n in drain(steps, batch).items()},
            {r: float(n) for r, n in drain(tokens, batch).items()}, float(sum(tokens)))


def modelled(table: CostTable, shape: DraftShape, batch: int, cap: int | None = None) -> dict[str, Any]:
    """The modelled speedup over plain decoding at `batch`, tokens/s of the batch, and the mean step's
    split: every step priced at the rows still active in it (and their padded block)."""
    spec, plain, tokens = occupancies(shape, batch, cap)
    steps = {rows: step_cost(table, shape, rows, cap) for rows in spec}
    spec_s = sum(n * steps[rows]["step_s"] for rows, n in spec.items())
    ar_s = sum(n * (table.target_s(1, shape.context, rows) + table.overhead_s(1, rows)) for rows, n in plain.items())
    count, ar_count = sum(spec.values()), sum(plain.values())
    mean = {key: sum(n * steps[rows][key] for rows, n in spec.items()) / count
            for key in ("block", "verify_s", "draft_s", "overhead_s", "step_s")}
    return {"batch_size": batch, "modelled": True, "tau": tau(shape, cap) if shape.drafter else 1.0, **mean,
            "rows": sum(rows * n for rows, n in spec.items()) / count, "ar_step_s": ar_s / ar_count,
            "tokens_per_s": tokens / spec_s, "speedup": ar_s / spec_s}


def sweep(table: CostTable, shape: DraftShape, batch_sizes: Sequence[int] | None = None,
          cap: int | None = None) -> list[dict[str, Any]]:
    """`modelled` at every batch size of the table (or the ones given)."""
    return [modelled(table, shape, b, cap) for b in batch_sizes or table.batch_sizes()]


def stops_paying(points: Sequence[dict[str, Any]]) -> int | None:
    """The first batch size whose speedup is below 1 (points in increasing batch order); None if none is."""
    return next((p["batch_size"] for p in points if p["speedup"] < 1.0), None)


def best_caps(table: CostTable, shape: DraftShape, batch_sizes: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Per batch size, the draft cap that maximises modelled throughput (0: plain decoding pays best).

    Chains try every cap up to the longest draft the run measured (acceptance beyond it is unknown);
    a tree is all or nothing: its measured shape, or no drafting."""
    caps = [0, None] if shape.tree else list(range(shape.max_drafted + 1))
    best = []
    for batch in batch_sizes or table.batch_sizes():
        point, cap = max(((modelled(table, shape, batch, cap), cap) for cap in caps), key=lambda o: o[0]["speedup"])
        best.append({"batch_size": batch, "draft_tokens": shape.max_drafted if cap is None else cap,
                     "speedup": point["speedup"], "tokens_per_s": point["tokens_per_s"]})
    return best
