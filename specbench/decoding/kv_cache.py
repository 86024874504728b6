"""Every KV-cache manipulation lives here, so that a transformers cache API change costs one file.

Two caches: flat.StaticKV (preallocated, written in place) for the targets and drafters the fast
forward runs (decoding/flat.py), and transformers' DynamicCache for every other model, or for all of
them with the fast path off. transformers 5.x: a DynamicCache holds `layers`, each with `keys` /
`values` of shape (batch, kv_heads, seq, head_dim); `crop` takes a negative count of tokens to drop;
the forward's keyword for it is `cache` from 5.2x and `past_key_values` before (`run_model` picks).

Layer types: full attention, and sliding-window attention (Mistral's `sliding_window`, Gemma's and
Qwen3's `layer_types`). The cache always keeps every position of every layer (transformers'
sliding layers drop old positions, which would break compaction by position); sliding layers get
the window through the attention mask instead, in the tree masks built here as in transformers'
own. Any other layer type (linear attention, state-space or chunked layers) holds state that cannot
be compacted to an accepted path, and such a target is refused.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from transformers import DynamicCache, PretrainedConfig

from specbench.core.errors import SpecbenchError
from specbench.decoding.flat import FlatLM, StaticKV, supports
from specbench.decoding.tree import DraftTree, tree_attention_mask

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


Cache = DynamicCache | StaticKV
_fast_path = True


@contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    """Whether caches made inside run decoding/flat.py's fast forward, for the models it supports (the
    default), or transformers' forward."""
    global _fast_path
    before, _fast_path = _fast_path, enabled
    try:
        yield
    finally:
        _fast_path = before


def flat_model(model: torch.nn.Module) -> FlatLM:
    """The model's fast forward, built once."""
    flat = getattr(model, "_specbench_flat", None)
    if flat is None:
        flat = FlatLM(model)
        object.__setattr__(model, "_specbench_flat", flat)  # not a submodule: no weights registered twice
    return flat


def new_cache(model: torch.nn.Module) -> Cache:
    check_supported(model.config)
    if _fast_path and supports(model):
        return flat_model(model).new_cache()
    return DynamicCache()  # full layers throughout: windows are applied by the masks


@functools.cache
def cache_keyword(model_class: type) -> str:
    """The keyword the installed transformers takes a cache under: `cache` (5.2x) or `past_key_values` (5.19)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def run_model(model: torch.nn.Module, cache: Cache, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
              attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
              output_hidden_states: bool = False, logits_to_keep: int = 0):
    """One forward of `model` over input_ids (batch, new) after the cache's positions, extending the
    cache: an object with `logits` (of the last `logits_to_keep` positions; 0: all) and `hidden_states`
    (transformers' tuple, or None)."""
    if isinstance(cache, StaticKV):
        return flat_model(model).forward(input_ids, cache, position_ids, attention_mask, output_hidden_states,
                                         logits_to_keep)
    return model(input_ids=input_ids, use_cache=True, position_ids=position_ids, attention_mask=attention_mask,
                 output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep,
                 **{cache_keyword(type(model)): cache})


def cache_length(cache: Cache) -> int:
    return cache.length if isinstance(cache, StaticKV) else cache.get_seq_length()


def truncate(cache: Cache, length: int) -> None:
    """Keep the first `length` positions."""
    if isinstance(cache, StaticKV):
        cache.length = min(cache.length, length)
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def buffers(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) tensors, whose positions compaction moves in place."""
    if isinstance(cache, StaticKV):
        return list(zip(cache.keys, cache.values))
    return [(layer.keys, layer.values) for layer in cache.layers]


def keep_path(cache: Cache, start: int, offsets: list[int]) -> None:
    """Compact a verified tree to its accepted path.

    Positions start + offsets[i] move to start + i, and everything after them is dropped. A chain's
    accepted path is a prefix (offsets == 0, 1, 2, ...), which needs no copy, only a truncation.
    """
    if offsets != list(range(len(offsets))):
        layers = buffers(cache)
        index = torch.tensor(offsets, device=layers[0][0].device) + start
        for keys, values in layers:
            keys[..., start:start + len(offsets), :] = keys.index_select(-2, index)
            values[..., start:start + len(offsets), :] = values.index_select(-2, index)
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


def move_positions(cache: Cache, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Batched compaction: in batch row rows[k], position src[k] moves to dst[k] (all reads before any write)."""
    for keys, values in buffers(cache):
        keys[rows, :, dst] = keys[rows, :, src]
        values[rows, :, dst] = values[rows, :, src]


def keep_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only these batch rows (sequences that finished leave the batch)."""
    if isinstance(cache, StaticKV):
        cache.keys = [k[rows] for k in cache.keys]
        cache.values = [v[rows] for v in cache.values]
    else:
        cache.batch_select_indices(rows)


def repeat_rows(cache: Cache, count: int) -> None:
    """Every batch row `count` times (a cost measurement's filled batch)."""
    if isinstance(cache, StaticKV):
        cache.keys = [k.repeat_interleave(count, dim=0) for k in cache.keys]
        cache.values = [v.repeat_interleave(count, dim=0) for v in cache.values]
    else:
        cache.batch_repeat_interleave(count)


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
        elif isinstance(state, StaticKV):
            total += state_bytes(*state.live())  # the live positions, as a DynamicCache holds them
        elif isinstance(state, DynamicCache):
            total += state_bytes(*[(layer.keys, layer.values) for layer in state.layers if layer.keys is not None])
        elif isinstance(state, (tuple, list)):
            total += state_bytes(*state)
    return total
