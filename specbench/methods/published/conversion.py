"""Published checkpoints into specbench's own drafter format and back, where the shapes allow it exactly.

Supported directions (every other one is refused with the reason):
- DFlash (z-lab) -> specbench dflash: the same network; specbench's mask vector is the target's
  embedding row of mask_token_id. Needs default RoPE and no sliding-window layers.
- DSpark (DeepSpec) -> specbench dspark: the same network when the Markov head is `vanilla`, the
  confidence head reads [hidden, W1[prev]] and the checkpoint's embedding and LM head are the
  target's (DeepSpec copies and freezes them); the mask vector is its embedding row of mask_token_id.
- specbench dspark -> DSpark (DeepSpec): for Qwen3 targets (DeepSpec's Qwen3DSparkModel); the
  embedding table is the target's with the mask vector in row mask_token_id, an id the tokenizer never
  produces (a padding row of the vocabulary, or --mask-token-id). Loading it back gives the same
  drafts, except where that id itself is the last committed token.
Not convertible: specbench's EAGLE and EAGLE-3 (EAGLE-3's q/k/v read the 2H concatenation and its
residual is the fused feature; specbench's layer projects 2H -> H first), specbench's MTP and the
targets' own MTP blocks (those are the target's decoder-layer kind), specbench dflash -> z-lab (z-lab
embeds MASK with the target's table, which has no row for a learned mask vector), and DeepSpec's
DFlash (its anchor slot drafts, specbench's dflash layout does not).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.target import Target, fingerprint
from specbench.methods.dflash import BlockConfig, DFlashOptions
from specbench.methods.drafter_dir import load_drafter, save_drafter, write_checkpoint
from specbench.methods.dspark import DSparkOptions
from specbench.methods.layers import Arch
from specbench.methods.published.block import MASK, block_size, check_architecture, layer_windows, layout
from specbench.methods.published.block import published_name as published_block_name
from specbench.methods.published.block import specbench_name as specbench_block_name
from specbench.methods.published.common import hf_config
from specbench.methods.published.formats import DrafterSource

HEAD_NAMES = {"markov_head.markov_w1": "markov_in", "markov_head.markov_w2": "markov_out",
              "confidence_head.proj": "confidence"}  # DeepSpec's DSpark heads -> specbench's
NOT_CONVERTIBLE = {
    "eagle3": "EAGLE-3's q/k/v read the 2H concatenation and its residual is the fused feature, specbench's "
              "eagle layer projects 2H -> H first",
    "deepspec-dflash": "its anchor slot drafts, specbench's dflash layout does not",
    "draft-lm": "a causal LM serves `draft` as it is, there is nothing to convert",
}
DIRECTIONS = ("dflash (z-lab) -> specbench dflash", "dspark (DeepSpec) -> specbench dspark",
              "specbench dspark -> dspark (DeepSpec)")


@dataclass
class Conversion:
    source: str
    source_format: str
    out: Path
    out_format: str
    notes: list[str]

    def as_json(self) -> dict:
        return {**dataclasses.asdict(self), "out": str(self.out)}


def _specbench_name(key: str) -> str:
    module, _, leaf = key.rpartition(".")
    return f"{HEAD_NAMES[module]}.{leaf}" if module in HEAD_NAMES else specbench_block_name(key)


def _published_name(key: str) -> str:
    module, _, leaf = key.rpartition(".")
    back = {v: k for k, v in HEAD_NAMES.items()}
    return f"{back[module]}.{leaf}" if module in back else published_block_name(key)


def _refuse(source: DrafterSource, why: str) -> SpecbenchError:
    return SpecbenchError(f"cannot convert {source.checkpoint.name} ({source.format}) exactly: {why}; "
                          f"supported: {'; '.join(DIRECTIONS)}")


def _block_config(source: DrafterSource, target: Target) -> tuple[BlockConfig, int]:
    """specbench's architecture for a published block checkpoint, refusing what it cannot express."""
    name, raw = source.checkpoint.name, source.checkpoint.config
    config = hf_config(raw, name)
    check_architecture(config, name)
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise _refuse(source, f"its RoPE is {rope.get('rope_type')}, specbench's block drafters use the default")
    if any(layer_windows(config, raw, config.num_hidden_layers, name)):
        raise _refuse(source, "it has sliding-window layers, which specbench's block drafters do not")
    ids, mask_id, shifted = layout(source, target.model.config.num_hidden_layers)
    rank = int(raw.get("markov_rank") or 0)
    return BlockConfig(Arch.of(config), config.vocab_size, config.num_hidden_layers, tuple(i + 1 for i in ids), shifted,
                       rank), mask_id


def _same_as_target(source: DrafterSource, tensor: torch.Tensor, target_tensor: torch.Tensor, what: str,
                    except_row: int | None = None) -> None:
    keep = torch.ones(len(tensor), dtype=torch.bool)
    if except_row is not None:
        keep[except_row] = False
    if tensor.shape != target_tensor.shape or not torch.equal(tensor[keep].float(), target_tensor[keep].float()):
        raise _refuse(source, f"its {what} differs from the target's, and specbench's format uses the target's")


def to_specbench(source: DrafterSource, target: Target, out: Path) -> Conversion:
    """z-lab DFlash or DeepSpec DSpark -> a specbench drafter directory for `target`."""
    if source.format not in ("dflash", "deepspec-dspark"):
        raise _refuse(source, NOT_CONVERTIBLE.get(source.format, "there is no specbench layout for it"))
    block, mask_id = _block_config(source, target)
    raw = source.checkpoint.config
    state = source.checkpoint.load(source.checkpoint.weight_names())
    embedding = target.model.get_input_embeddings().weight.detach().cpu()
    if source.format == "deepspec-dspark":
        if str(raw.get("markov_head_type", "vanilla")).lower() != "vanilla":
            raise _refuse(source, f"its Markov head is {raw['markov_head_type']}, specbench's dspark has a vanilla one")
        if not (raw.get("enable_confidence_head") and raw.get("confidence_head_with_markov")):
            raise _refuse(source, "specbench's dspark has a confidence head reading [hidden, W1[prev]], it has not")
        own = state.pop("embed_tokens.weight")
        _same_as_target(source, own, embedding, "embedding", except_row=mask_id)
        head = target.model.get_output_embeddings().weight.detach().cpu()
        _same_as_target(source, state.pop("lm_head.weight"), head, "LM head")
        mask = own[mask_id]
        options = DSparkOptions(block_size=block_size(raw) or DSparkOptions.block_size, context_window=0,
                                layers=block.layers, markov_rank=block.markov_rank)
        strategy = "dspark"
    else:
        mask = embedding[mask_id]
        options = DFlashOptions(block_size=block_size(raw) or DFlashOptions.block_size, context_window=0,
                                layers=block.layers)
        strategy = "dflash"
    state = {_specbench_name(k): v for k, v in state.items()}
    state[MASK] = mask
    config = {"architecture": dataclasses.asdict(block), "knobs": dataclasses.asdict(options),
              "converted_from": {"format": source.format, "path": source.checkpoint.name}}
    save_drafter(out, strategy, config, state, fingerprint(target.model), source.checkpoint.dtype())
    return Conversion(source.checkpoint.name, source.format, out, f"specbench {strategy}",
                      [f"mask vector = row {mask_id} of the {'checkpoint' if strategy == 'dspark' else 'target'}'s "
                       "embedding"])


def free_token_id(target: Target) -> int | None:
    """A vocabulary row the tokenizer never produces (the padding rows past its last token), or None."""
    tokenizer_size = len(target.tokenizer) if target.tokenizer is not None else None
    vocab = target.model.get_input_embeddings().weight.shape[0]
    return vocab - 1 if tokenizer_size is not None and tokenizer_size < vocab else None


def to_deepspec(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None) -> Conversion:
    """A specbench dspark directory -> DeepSpec's Qwen3DSparkModel layout."""
    if source.strategy == "dflash":
        raise _refuse(source, "z-lab's DFlash embeds MASK with the target's own table, which has no row for "
                              "specbench's learned mask vector")
    if source.strategy != "dspark":
        raise _refuse(source, f"a specbench {source.strategy} drafter has no published layout it maps onto exactly")
    t = target.model.config
    if t.model_type != "qwen3":
        raise _refuse(source, f"DeepSpec's DSpark class is Qwen3's, the target is {t.model_type}")
    saved, state = load_drafter(source.path, "dspark", fingerprint(target.model))
    if "vocab.ids" in state:
        raise _refuse(source, "it scores a reduced draft vocabulary, and DeepSpec's layout carries no "
                              "draft-vocabulary map")
    block = BlockConfig.from_dict(saved["architecture"])
    mask_id = mask_token_id if mask_token_id is not None else free_token_id(target)
    vocab = target.model.get_input_embeddings().weight.shape[0]
    if mask_id is None or not 0 <= mask_id < vocab:
        raise SpecbenchError("specbench dspark -> DeepSpec needs a mask token id the tokenizer never produces: the "
                             "target's vocabulary has no free row, give one with --mask-token-id")
    embedding = target.model.get_input_embeddings().weight.detach().cpu().clone()
    embedding[mask_id] = state.pop(MASK)
    out_state = {_published_name(k): v for k, v in state.items()}
    out_state.update({"embed_tokens.weight": embedding,
                      "lm_head.weight": target.model.get_output_embeddings().weight.detach().cpu()})
    a = block.arch
    knobs = saved.get("knobs", {})
    config = {**t.to_dict(), "architectures": ["Qwen3DSparkModel"], "num_target_layers": t.num_hidden_layers,
              "num_hidden_layers": block.layers, "hidden_size": a.hidden_size, "num_attention_heads": a.num_heads,
              "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim, "intermediate_size": a.intermediate_size,
              "rms_norm_eps": a.rms_norm_eps, "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
              "block_size": knobs.get("block_size", DSparkOptions.block_size),
              "layer_types": ["full_attention"] * block.layers, "mask_token_id": mask_id,
              "target_layer_ids": [i - 1 for i in block.target_layers], "num_anchors": 512,
              "enable_confidence_head": True, "confidence_head_with_markov": True, "markov_rank": block.markov_rank,
              "markov_head_type": "vanilla", "tie_word_embeddings": False, "attention_bias": False}
    config.pop("rope_theta", None)
    write_checkpoint(out, config, out_state, source.checkpoint.dtype())
    return Conversion(str(source.path), "specbench", out, "deepspec-dspark",
                      [f"mask_token_id {mask_id}: exact unless that id is itself the last committed token"])


def convert(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None = None) -> Conversion:
    """Convert a drafter checkpoint (formats.open_source) for `target`, the direction following from its format."""
    if Path(out).exists() and any(Path(out).iterdir()):
        raise SpecbenchError(f"--out {out} exists and is not empty; give a new directory for the converted drafter")
    if source.format == "specbench":
        return to_deepspec(source, target, Path(out), mask_token_id)
    return to_specbench(source, target, Path(out))
