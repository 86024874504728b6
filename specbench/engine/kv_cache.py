"""Every KV-cache manipulation lives here, so that a transformers cache API change costs one file.

transformers 5.x: a DynamicCache holds `layers`, each with `keys` / `values` of shape
(batch, kv_heads, seq, head_dim); `crop` takes a negative count of tokens to drop.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig


def new_cache(config: PretrainedConfig) -> DynamicCache:
    return DynamicCache(config=config)


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def keep_path(cache: DynamicCache, start: int, offsets: list[int]) -> None:
    """Compact a verified tree to its accepted path.

    Positions start + offsets[i] move to start + i, and everything after them is dropped. A chain's
    accepted path is a prefix (offsets == 0, 1, 2, ...), which needs no copy, only a truncation.
    """
    if offsets != list(range(len(offsets))):
        index = torch.tensor(offsets, device=cache.layers[0].keys.device) + start
        for layer in cache.layers:
            layer.keys[..., start:start + len(offsets), :] = layer.keys.index_select(-2, index)
            layer.values[..., start:start + len(offsets), :] = layer.values.index_select(-2, index)
    truncate(cache, start + len(offsets))
