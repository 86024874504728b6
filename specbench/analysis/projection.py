"""Roofline projection of speculative-decoding speed onto a GPU profile that is not the local one.

One decode step = one target verify forward + the step's draft forwards + a fixed overhead. Each
forward takes max(bytes read / bandwidth, FLOPs / dense bf16 rate). At batch B the target reads its
weights once per forward and each sequence's KV cache of its context, and spends 2 x params FLOPs
per token it processes: B x tokens verified (flattened, as a serving engine batches ragged drafts).
The drafter is batched the same way: its weights once per draft forward, its FLOPs B times.
Projected tokens/s = B x tau / step time; the speedup is over the `ar` projection of the same
workload (one token per sequence and step, no drafter). As B grows the verify forward turns from
memory-bound to compute-bound, and there the extra tokens speculation verifies cost real time:
`by_batch` sweeps the batch sizes and says where the speedup falls below 1. Attention FLOPs,
drafter KV and activation traffic are left out: the model says so by being a roofline, not a
simulator. Every figure it returns is marked `projected: True`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from specbench.analysis.hardware import GpuProfile
from specbench.core.errors import SpecbenchError

STEP_OVERHEAD_S = 20e-6
"""Fixed cost of one decode step beyond its forwards: launches, sampling, host synchronisation."""

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""The batch sizes `by_batch` projects."""


@dataclass(frozen=True)
class WorkloadShape:
    """The hardware-independent quantities a run measured, per decode step.

    target_params, drafter_params: parameter counts (drafter 0 for `ar` and weight-free drafters).
    bytes_per_param: bytes per weight (2 for bf16), used for the target and the drafter.
    kv_bytes_per_token: layers x 2 x kv_heads x head_dim x bytes (see `kv_bytes_per_token`).
    context_len: tokens of context whose KV the verify forward reads (typical or mean length).
    tokens_verified: positions in the target's verify forward (drafted tokens + 1; 1 for `ar`).
    draft_forwards: drafter forward passes per step (may be a mean, e.g. 3.2).
    tau: tokens committed per target step, the bonus token included (1 for `ar`).
    draft_tokens_per_forward: positions one draft forward processes (1 for a chain drafter,
        the block size for a DFlash-style block drafter, the tree width for a tree level).
    batch_size: sequences decoded together, each with this shape.
    """

    target_params: float
    bytes_per_param: float
    drafter_params: float
    kv_bytes_per_token: float
    context_len: float
    tokens_verified: float = 1.0
    draft_forwards: float = 0.0
    tau: float = 1.0
    draft_tokens_per_forward: float = 1.0
    batch_size: float = 1.0

    def __post_init__(self) -> None:
        for name in ("target_params", "bytes_per_param"):
            _check(name, getattr(self, name), low=0.0, inclusive=False)
        for name in ("drafter_params", "kv_bytes_per_token", "context_len", "draft_forwards"):
            _check(name, getattr(self, name), low=0.0, inclusive=True)
        for name in ("tokens_verified", "tau", "draft_tokens_per_forward", "batch_size"):
            _check(name, getattr(self, name), low=1.0, inclusive=True)
        if self.tau > self.tokens_verified:
            raise SpecbenchError(
                f"workload tau {self.tau} exceeds tokens_verified {self.tokens_verified}: "
                "a step cannot commit more tokens than its verify forward holds"
            )


def _check(name: str, value: float, low: float, inclusive: bool) -> None:
    ok = math.isfinite(value) and (value >= low if inclusive else value > low)
    if not ok:
        raise SpecbenchError(f"workload {name} must be {'>=' if inclusive else '>'} {low:g}, got {value!r}")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_elem: float) -> float:
    """KV-cache bytes one token adds: layers x 2 (K and V) x kv_heads x head_dim x bytes."""
    return float(layers * 2 * kv_heads * head_dim * bytes_per_elem)


def drafter_parameters(drafter) -> int:
    """Parameters of a drafter's networks, of every member of a combination (0 for ngram and `ar`)."""
    members = drafter.members if drafter is not None else []
    return sum(p.numel() for m in members if m.model is not None for p in m.model.parameters())


def workload_shape(target_model, drafter, rows) -> WorkloadShape:
    """The shape one strategy's measured rows (a DataFrame of bench rows) describe, with its target's and
    drafter's sizes, weights and KV in bf16 as served on a GPU."""
    config = target_model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    steps = rows.steps.sum()
    depth = rows.draft_depth.sum() / steps
    verified = rows.verified.sum() / steps
    parallel = drafter is not None and drafter.parallel_draft
    return WorkloadShape(
        target_params=sum(p.numel() for p in target_model.parameters()), bytes_per_param=2,
        drafter_params=drafter_parameters(drafter),
        kv_bytes_per_token=kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, head_dim, 2),
        context_len=float((rows.prompt_tokens + rows.new_tokens / 2).mean()),
        tokens_verified=verified, draft_forwards=min(depth, 1.0) if parallel else depth,
        # a block drafter that drafts under one token a step on average still runs whole forwards when it drafts
        tau=min(rows.new_tokens.sum() / steps, verified), draft_tokens_per_forward=max(depth, 1.0) if parallel else 1.0)


def ar_shape(shape: WorkloadShape) -> WorkloadShape:
    """The same workload decoded plainly: one token verified and committed per step, no drafter."""
    return replace(shape, drafter_params=0.0, tokens_verified=1.0, draft_forwards=0.0, tau=1.0)


def _forward_s(bytes_read: float, flops: float, profile: GpuProfile) -> tuple[float, str]:
    memory_s = bytes_read / (profile.bandwidth_gbs * 1e9)
    compute_s = flops / (profile.bf16_tflops * 1e12)
    return (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")


def step_time(shape: WorkloadShape, profile: GpuProfile) -> dict[str, Any]:
    """Projected time of one decode step on `profile`, split into verify, draft and overhead."""
    b = shape.batch_size
    verify_s, bound = _forward_s(
        shape.target_params * shape.bytes_per_param + b * shape.kv_bytes_per_token * shape.context_len,
        2.0 * shape.target_params * b * shape.tokens_verified,
        profile,
    )
    draft_s = 0.0
    if shape.draft_forwards > 0 and shape.drafter_params > 0:
        one, _ = _forward_s(
            shape.drafter_params * shape.bytes_per_param,
            2.0 * shape.drafter_params * b * shape.draft_tokens_per_forward,
            profile,
        )
        draft_s = shape.draft_forwards * one
    return {
        "projected": True,
        "gpu": profile.name,
        "verify_s": verify_s,
        "verify_bound": bound,
        "draft_s": draft_s,
        "overhead_s": STEP_OVERHEAD_S,
        "step_s": verify_s + draft_s + STEP_OVERHEAD_S,
    }


def memory_fit(shape: WorkloadShape, profile: GpuProfile) -> tuple[bool, float, float]:
    """(fits, need_gb, have_gb): target + drafter weights + KV at the context length vs memory."""
    need = (
        (shape.target_params + shape.drafter_params) * shape.bytes_per_param
        + shape.batch_size * shape.kv_bytes_per_token * shape.context_len
    ) / 1e9
    return need <= profile.memory_gb, need, float(profile.memory_gb)


def project(shape: WorkloadShape, profile: GpuProfile) -> dict[str, Any]:
    """Projected tokens/s and speedup over `ar` on `profile`, the step split, and the memory fit."""
    step = step_time(shape, profile)
    ar_step = step_time(ar_shape(shape), profile)
    tokens_per_s = shape.batch_size * shape.tau / step["step_s"]
    ar_tokens_per_s = shape.batch_size / ar_step["step_s"]
    fits, need_gb, have_gb = memory_fit(shape, profile)
    return {
        **step,
        "tau": shape.tau,
        "tokens_per_s": tokens_per_s,
        "ar_tokens_per_s": ar_tokens_per_s,
        "speedup": tokens_per_s / ar_tokens_per_s,
        "memory_fit": {"projected": True, "fits": fits, "need_gb": need_gb, "have_gb": have_gb},
    }


def by_batch(shape: WorkloadShape, profile: GpuProfile, batch_sizes: tuple[int, ...] = BATCH_SIZES) -> dict[str, Any]:
    """The projected speedup at each batch size, and the first batch size where it falls below 1
    (None: it still pays at the largest)."""
    points = []
    for b in batch_sizes:
        p = project(replace(shape, batch_size=float(b)), profile)
        points.append({"batch_size": b, "speedup": p["speedup"], "tokens_per_s": p["tokens_per_s"],
                       "verify_bound": p["verify_bound"], "fits": p["memory_fit"]["fits"]})
    stops = next((p["batch_size"] for p in points if p["speedup"] < 1.0), None)
    return {"projected": True, "gpu": profile.name, "points": points, "stops_paying_at": stops}

