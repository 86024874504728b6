"""The memory a strategy needs, computed rather than read off the process: the weights of the target
and the drafter plus the KV cache at the run's lengths and the drafter's own per-sequence state.

The process's peak (RSS on CPU, the allocator's peak on CUDA) is recorded beside it, but on a CPU it
is one high-water mark for the whole run, the same for every strategy, so it cannot tell them apart.
"""

from __future__ import annotations

import torch


def weight_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers of `modules`, each tensor counted once even where shared."""
    seen: dict[int, int] = {}
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            seen.setdefault(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    return sum(seen.values())


def drafter_modules(drafter) -> list[torch.nn.Module]:
    """The networks of a drafter, or of each member of a combination (ngram has none)."""
    return [m.model for m in drafter.members if m.model is not None] if drafter is not None else []


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Target KV-cache bytes one token adds: layers x (K and V) x kv heads x head dim x element size."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def needed_bytes(target_model: torch.nn.Module, drafter, context_tokens: int, drafter_state: int) -> int:
    """Weights of target and drafter, the target's KV cache over `context_tokens` positions (prompt,
    answer and the largest verified tree), and the drafter's per-sequence state."""
    weights = weight_bytes(target_model, *drafter_modules(drafter))
    kv = kv_bytes_per_token(target_model.config, target_model.dtype) * context_tokens
    return weights + kv + drafter_state
