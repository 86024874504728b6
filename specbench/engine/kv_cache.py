"""Every KV-cache manipulation lives here, so that a transformers cache API change costs one file.

transformers 5.x: a DynamicCache holds `layers`, each with `keys` / `values` of shape
(batch, kv_heads, seq, head_dim); `crop` takes a negative count of tokens to drop.

Layer types: full attention, and sliding-window attention (Mistral's `sliding_window`, Gemma's and
Qwen3's `layer_types`). The cache always keeps every position of every layer (transformers'
sliding layers drop old positions, which would break compaction by position); sliding layers get
the window through the attention mask instead, in the tree masks built here as in transformers'
own. Any other layer type (linear attention, state-space or chunked layers) holds state that cannot
be compacted to an accepted path, and such a target is refused.
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache, PretrainedConfig

from specbench.engine.tree import DraftTree, tree_attention_mask
from specbench.errors import SpecbenchError

FULL, SLIDING = "full_attention", "sliding_attention"


def layer_types(config: PretrainedConfig) -> list[str]:
    """Each decoder layer's attention type, as transformers names them."""
    declared = getattr(config, "layer_types", None)
    if declared:
        return list(declared)
    return [SLIDING if getattr(config, "sliding_window", None) else FULL] * config.num_hidden_layers


def check_supported(config: PretrainedConfig, what: str = "target") -> None:
    """Refuse a model whose cache cannot be compacted to an accepted path, naming the layer type."""
    unsupported = sorted(set(layer_types(config)) - {FULL, SLIDING})
    if unsupported:
        raise SpecbenchError(f"the {what} has {', '.join(unsupported)} layers, whose cached state cannot be cut back "
                             "to an accepted draft; specbench verifies drafts on full and sliding-window "
                             "attention layers only")


def new_cache(config: PretrainedConfig) -> DynamicCache:
    check_supported(config)
    return DynamicCache()  # full layers throughout: windows are applied by the masks


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


def per_layer_type(config: PretrainedConfig,
                   build: Callable[[int | None], torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """`build(window)` (window None for full attention) in the form the model takes: one mask, or one
    per layer type where the config declares `layer_types` and mixes or windows them."""
    types = set(layer_types(config))
    masks = {kind: build(config.sliding_window if kind == SLIDING else None) for kind in types}
    if len(masks) == 1 and (types == {FULL} or not getattr(config, "layer_types", None)):
        return next(iter(masks.values()))
    return masks


def attention_masks(config: PretrainedConfig, tree: DraftTree, cached: int, dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor | dict[str, torch.Tensor]:
    """The tree mask in the form the model takes (see per_layer_type)."""
    return per_layer_type(config, lambda window: tree_attention_mask(tree, cached, dtype, device, window))


def move_positions(cache: DynamicCache, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Batched compaction: in batch row rows[k], position src[k] moves to dst[k] (all reads before any write)."""
    for layer in cache.layers:
        layer.keys[rows, :, dst] = layer.keys[rows, :, src]
        layer.values[rows, :, dst] = layer.values[rows, :, src]


def keep_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only these batch rows (sequences that finished leave the batch)."""
    cache.batch_select_indices(rows)


def layer_cache(layer_idx: int, past: tuple[torch.Tensor, torch.Tensor] | None) -> DynamicCache:
    """A cache holding `past` keys/values at `layer_idx`, to run one transformers decoder layer (a target's
    own MTP block) over new rows; layer_kv reads back past and new together."""
    cache = DynamicCache()
    if past is not None:
        cache.update(past[0], past[1], layer_idx)
    return cache


def layer_kv(cache: DynamicCache, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    layer = cache.layers[layer_idx]
    return layer.keys, layer.values


def state_bytes(*states) -> int:
    """Bytes of the tensors in `states`: tensors, caches, or (nested) tuples and lists of them."""
    total = 0
    for state in states:
        if isinstance(state, torch.Tensor):
            total += state.numel() * state.element_size()
        elif isinstance(state, DynamicCache):
            total += state_bytes(*[(layer.keys, layer.values) for layer in state.layers if layer.keys is not None])
        elif isinstance(state, (tuple, list)):
            total += state_bytes(*state)
    return total
