"""Products with frozen weights at inference. On a CPU they go through oneDNN with each weight reordered
once into oneDNN's blocked layout (the call torch.compile's CPU backend makes for frozen weights), not
through F.linear, whose GEMM packs the weight again at every call.

On the embedded target (weights 4x the L3 cache), F.linear made a verify forward over 9 tokens cost
1.5x a forward over one; with packed weights it costs 1.2x, and the one-token forward is faster too
(scripts/bench_fastpath.py). The packed copy is a second copy of the weight, made again whenever the
weight's values may have changed and dropped with the weight. Where gradients are recorded (training)
the product is F.linear's. Rounding differs from F.linear's (another kernel, another order of
summation), by about 1e-5 on the embedded target's logits: each engine's forwards are compared with
each other, never across kernels.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F

PACKED_ROWS = 64  # the rows oneDNN picks its layout for: measured as fast as 1..16 at 1-17 rows, faster on prefill
_packing = True


@contextlib.contextmanager
def packing(enabled: bool) -> Iterator[None]:
    """Within the block, `linear` packs weights (the default) or is F.linear."""
    global _packing
    before, _packing = _packing, enabled
    try:
        yield
    finally:
        _packing = before


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_ROWS)


@functools.cache
def onednn(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch packs and multiplies weights of `dtype` in oneDNN's layout on this CPU, tried
    once per dtype. It needs a build with oneDNN and its private ops (what torch.compile's CPU backend
    calls, not a public API), and for bfloat16 instructions not every x86 CPU has: oneDNN refuses it
    without avx_ne_convert or avx512bw/vl/dq (an AVX2-only EPYC), and products of that dtype are F.linear's."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = _reorder(torch.ones(2, 2, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=dtype), weight, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


def bf16_native(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 natively: a CUDA GPU that has it, a CPU with AVX512-BF16 or AMX
    (where it runs about 1.5x float32's speed in a drafter's training step; on an AVX2-only CPU it is
    emulated, slower than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    cpu = getattr(torch, "cpu", None)
    return device.type == "cpu" and any(getattr(cpu, probe, lambda: False)()
                                        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def packs(weight: torch.Tensor) -> bool:
    return (_packing and weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and not torch.is_grad_enabled() and onednn(weight.dtype))


def _state(weight: torch.Tensor) -> tuple:
    """What identifies the weight's values: its memory, dtype and shape (`.data = ...` and a module's `.to`
    swap them) and its version counter (an in-place change; an inference tensor has none)."""
    version = -1 if weight.is_inference() else weight._version
    return weight.data_ptr(), weight.dtype, weight.shape, version


# id(weight) -> (the weight, weakly; its state when packed; the packed copy). Kept beside the weight, not
# on it: an attribute would travel with the tensor into torch.save, which cannot write oneDNN's layout.
_packed: dict[int, tuple[weakref.ref, tuple, torch.Tensor]] = {}


def packed(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's layout, made again whenever the weight's values may have changed and
    dropped with the weight."""
    key, state = id(weight), _state(weight)
    entry = _packed.get(key)
    if entry is None or entry[0]() is not weight or entry[1] != state:
        entry = (weakref.ref(weight, lambda _, key=key: _packed.pop(key, None)), state,
                 _reorder(weight.detach()))
        _packed[key] = entry
    return entry[2]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through the packed weight where `packs` says so."""
    if not packs(weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed(weight), bias, "none", [], "")


class Linear(torch.nn.Linear):
    """nn.Linear (the same parameters and state_dict) whose inference product is `linear`'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
