"""specbench's drafters in the layouts vLLM loads, written once per drafter and cached.

| specbench | vLLM method | layout written |
| --- | --- | --- |
| eagle | `eagle3` | EAGLE-3 (SafeAILab / speculators, Llama config), two layers, see below |
| dflash | `dflash` | z-lab DFlash (`DFlashDraftModel`) plus `mask_embedding.pt` |
| dspark | `dspark` | DeepSpec DSpark (`Qwen3DSparkModel`), as convert.to_deepspec writes it |
| draft | `draft_model` | the draft LM's own directory, as it is |
| mtp | none | specbench's separate MTP modules have no vLLM counterpart for a target without MTP layers |

EAGLE-3: specbench's feature layer is proj(cat(embed_norm(e), feature_norm(f))) -> one pre-norm
block, where EAGLE-3's midlayer feeds the 2H concatenation to q/k/v and keeps f as its residual. vLLM
runs multi-layer EAGLE-3 drafters (layers.0 the midlayer, layers.1.. plain Llama layers), so the
block is layers.1 and layers.0 computes x = proj(cat(...)): it attends to its own row only (its q
and k are one constant bias, so RoPE scores every other row at least 200 logits below: a softmax
weight of exactly 0 in float32, up to max_position_embeddings; vLLM keeps all draft layers in one
KV-cache group, so a sliding window of 1 is refused), its attention output is then v_proj of its
input, v_proj is proj minus [0, I] on the feature half, its residual is feature_norm(f)
(`norm_before_residual`) and its MLP is zero. The block's KV heads are repeated per query head (the
same attention), as layer 0 needs as many value dimensions as the hidden size. Weights are written
in float32: proj - I does not round there as it would in bfloat16.

DFlash: vLLM replaces the embedding of every `mask_token_id` input with `mask_embedding.pt`
(specbench's learned mask vector); the id is one the tokenizer never produces, as the block's first
slot embeds the last committed token with the target's table and vLLM would give it the mask vector
if that token were the mask id. specbench's `context_window` has no vLLM counterpart: vLLM's DFlash
sees the whole context (specbench's with dflash.context_window=0).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch

from specbench.core.errors import SpecbenchError
from specbench.core.files import atomic_path, write_json
from specbench.decoding.target import Target, fingerprint
from specbench.methods.base import default_drafter_dir
from specbench.methods.dflash import BlockConfig
from specbench.methods.drafter_config import CONFIG
from specbench.methods.drafter_dir import WEIGHTS, load_drafter, write_checkpoint
from specbench.methods.published import module
from specbench.methods.published.block import MASK, published_name
from specbench.methods.published.conversion import Conversion, free_token_id, to_deepspec
from specbench.methods.published.formats import SPECBENCH, DrafterSource, format_named, open_source
from specbench.methods.registry import DRAFTER_NAMES, definition, formats

MASK_FILE = "mask_embedding.pt"


def _refuse(what: str, why: str) -> SpecbenchError:
    return SpecbenchError(f"cannot write {what} for vLLM: {why}")


SELF_MARGIN = 200.0  # softmax logit margin of layer 0's own row over any other: exp(-200) is 0 in float32


def self_attention_bias(head_dim: int, rope_theta: float, max_positions: int) -> float:
    """The q and k bias c (every entry, weights zero) that makes layer 0 attend to its own row alone.

    With q = k = c * ones, the RoPE'd score at distance d is c^2 sqrt(head_dim) mean_m cos(d theta_m),
    largest at d = 0; c is chosen so that every d in 1..max_positions scores SELF_MARGIN below it."""
    theta = rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    d = torch.arange(1, max_positions + 1, dtype=torch.float64)[:, None]
    gap = (1 - torch.cos(d * theta)).mean(-1).min().item()
    return math.sqrt(SELF_MARGIN / (gap * math.sqrt(head_dim)))


def repeat_heads(weight: torch.Tensor, kv_heads: int, head_dim: int, group: int) -> torch.Tensor:
    """k/v projection rows of kv_heads heads, each repeated for the `group` query heads that read it."""
    return weight.unflatten(0, (kv_heads, head_dim)).repeat_interleave(group, 0).flatten(0, 1)


def eagle3_state(config: dict, state: dict[str, torch.Tensor], target: Target) -> tuple[dict, dict]:
    """A specbench eagle drafter's config and float32 weights -> vLLM's two-layer EAGLE-3 config and weights."""
    a = config["arch"]
    h, heads, kv_heads, head_dim = a["hidden_size"], a["num_heads"], a["num_kv_heads"], a["head_dim"]
    width, positions = heads * head_dim, target.model.config.max_position_embeddings
    if width < h:
        raise _refuse("this eagle drafter", f"its {heads} heads of {head_dim} are narrower than its hidden size {h}, "
                      "so layer 0's values cannot carry the fused input")
    q, k, v = state["layer.block.wqkv.weight"].split([width, kv_heads * head_dim, kv_heads * head_dim])
    gate, up = state["layer.block.w13.weight"].chunk(2)
    values = torch.zeros(width, 2 * h)
    values[:h] = state["layer.proj.weight"] - torch.cat([torch.zeros(h, h), torch.eye(h)], 1)
    c = self_attention_bias(head_dim, a["rope_theta"], positions)
    zero, bias = torch.zeros, torch.full((width,), c)
    out = {
        "fc.weight": state["fc.weight"],
        "layers.0.input_layernorm.weight": state["layer.embed_norm.weight"],
        "layers.0.hidden_norm.weight": state["layer.feature_norm.weight"],
        "layers.0.self_attn.q_proj.weight": zero(width, 2 * h), "layers.0.self_attn.q_proj.bias": bias,
        "layers.0.self_attn.k_proj.weight": zero(width, 2 * h), "layers.0.self_attn.k_proj.bias": bias.clone(),
        "layers.0.self_attn.v_proj.weight": values, "layers.0.self_attn.v_proj.bias": zero(width),
        "layers.0.self_attn.o_proj.weight": torch.eye(h, width), "layers.0.self_attn.o_proj.bias": zero(h),
        "layers.0.post_attention_layernorm.weight": torch.ones(h),
        "layers.0.mlp.gate_proj.weight": zero(gate.shape), "layers.0.mlp.up_proj.weight": zero(up.shape),
        "layers.0.mlp.down_proj.weight": zero(state["layer.block.w2.weight"].shape),
        "layers.1.input_layernorm.weight": state["layer.block.attn_norm.weight"],
        "layers.1.self_attn.q_proj.weight": q, "layers.1.self_attn.q_proj.bias": zero(width),
        "layers.1.self_attn.k_proj.weight": repeat_heads(k, kv_heads, head_dim, heads // kv_heads),
        "layers.1.self_attn.k_proj.bias": zero(width),
        "layers.1.self_attn.v_proj.weight": repeat_heads(v, kv_heads, head_dim, heads // kv_heads),
        "layers.1.self_attn.v_proj.bias": zero(width),
        "layers.1.self_attn.o_proj.weight": state["layer.block.wo.weight"], "layers.1.self_attn.o_proj.bias": zero(h),
        "layers.1.post_attention_layernorm.weight": state["layer.block.mlp_norm.weight"],
        "layers.1.mlp.gate_proj.weight": gate, "layers.1.mlp.up_proj.weight": up,
        "layers.1.mlp.down_proj.weight": state["layer.block.w2.weight"],
        "norm.weight": state["layer.out_norm.weight"],
    }
    head = target.model.get_output_embeddings().weight.detach().float().cpu()
    vocab = head.shape[0]
    out.update(draft_head(head, state.get("vocab.ids")))
    hf = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
          "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": head_dim,
          "intermediate_size": gate.shape[0], "num_hidden_layers": 2, "hidden_act": "silu",
          "rms_norm_eps": a["rms_norm_eps"], "rope_parameters": {"rope_type": "default", "rope_theta": a["rope_theta"]},
          "rope_theta": a["rope_theta"], "vocab_size": vocab, "draft_vocab_size": out["lm_head.weight"].shape[0],
          "max_position_embeddings": positions, "tie_word_embeddings": False, "attention_bias": True,
          "mlp_bias": False, "norm_before_residual": True,
          "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config["hidden_layers"]),
                           "use_aux_hidden_state": True}}
    return hf, out


def draft_head(head: torch.Tensor, ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The LM head EAGLE-3's layout carries: the target's, or its rows of a draft vocabulary with the maps
    SafeAILab's and vLLM's EAGLE-3 read (draft id i is target id i + d2t[i]; t2d marks the target ids
    drafted), the ids in increasing order as SpecForge writes them."""
    if ids is None:
        return {"lm_head.weight": head}
    ids = ids.long().sort().values
    t2d = torch.zeros(len(head), dtype=torch.bool)
    t2d[ids] = True
    return {"lm_head.weight": head[ids], "d2t": ids - torch.arange(len(ids)), "t2d": t2d}


def refuse_draft_vocab(source: DrafterSource, state: dict[str, torch.Tensor], layout: str) -> None:
    if "vocab.ids" in state:
        raise _refuse(str(source.path), f"it scores a reduced draft vocabulary, and {layout} carries no "
                                        "draft-vocabulary map")


def write_eagle3(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None = None) -> Conversion:
    """A specbench eagle drafter -> vLLM's EAGLE-3 (which has no mask slot: mask_token_id is not read)."""
    config, state = load_drafter(source.path, "eagle", fingerprint(target.model))
    hf, weights = eagle3_state(config, state, target)
    write_checkpoint(out, hf, weights, torch.float32)
    layers = hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    return Conversion(str(source.path), "specbench", out, "eagle3 (vLLM, two layers)",
                      [f"vLLM method eagle3, target layers {layers}",
                       f"exact up to position {hf['max_position_embeddings']}"])


def choose_mask_id(target: Target, mask_token_id: int | None) -> int:
    """The id whose input slots carry the mask vector: --mask-token-id, a vocabulary row past the tokenizer's,
    or the padding token (generated text never holds it)."""
    mask_id = mask_token_id if mask_token_id is not None else free_token_id(target)
    if mask_id is None and target.tokenizer is not None:
        mask_id = target.tokenizer.pad_token_id
    vocab = target.model.get_input_embeddings().weight.shape[0]
    if mask_id is None or not 0 <= mask_id < vocab:
        raise SpecbenchError("specbench dflash and dspark -> vLLM need a mask token id the tokenizer never "
                             "produces: the target has no free row or padding token, give one with --mask-token-id")
    return mask_id


def write_dflash(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None) -> Conversion:
    saved, state = load_drafter(source.path, "dflash", fingerprint(target.model))
    refuse_draft_vocab(source, state, "z-lab's DFlash layout")
    block = BlockConfig.from_dict(saved["architecture"])
    if block.shifted:
        raise _refuse(str(source.path), "its anchor slot drafts, z-lab's DFlash layout does not")
    t = target.model.config
    mask_id = choose_mask_id(target, mask_token_id)
    mask = state.pop(MASK)
    a = block.arch
    knobs = saved.get("knobs", {})
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": a.hidden_size,
              "num_attention_heads": a.num_heads, "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim,
              "intermediate_size": a.intermediate_size, "num_hidden_layers": block.layers, "hidden_act": "silu",
              "rms_norm_eps": a.rms_norm_eps, "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
              "rope_theta": a.rope_theta, "vocab_size": block.vocab_size,
              "max_position_embeddings": t.max_position_embeddings, "tie_word_embeddings": False,
              "attention_bias": False, "layer_types": ["full_attention"] * block.layers,
              "num_target_layers": t.num_hidden_layers, "block_size": knobs.get("block_size", 8),
              "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": [i - 1 for i in block.target_layers],
                                "block_size": knobs.get("block_size", 8)}}
    write_checkpoint(out, config, {published_name(k): v for k, v in state.items()}, torch.float32)
    torch.save({"mask_token_id": mask_id, "embedding": mask.float().contiguous()}, out / MASK_FILE)
    return Conversion(str(source.path), "specbench", out, "dflash (z-lab, vLLM)",
                      [f"mask_token_id {mask_id} with {MASK_FILE}: exact unless that id is itself the last committed "
                       "token", "vLLM sees the whole context (specbench's dflash.context_window 0)"])


def write_dspark(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None) -> Conversion:
    """A specbench dspark drafter -> DeepSpec's DSpark layout, which vLLM's dspark method loads."""
    return to_deepspec(source, target, out, choose_mask_id(target, mask_token_id))


def _vllm_as_is(source: DrafterSource) -> bool:
    fmt = format_named(source.format)
    return fmt is not None and fmt.vllm_as_is


def _writer(strategy: str):
    """The function that writes a specbench drafter of `strategy` for vLLM: its format's Format.vllm_writer."""
    declared = formats(strategy) if strategy in DRAFTER_NAMES else ()
    found = next((fmt.vllm_writer for fmt in declared if fmt.vllm_writer), None)
    if found is None:
        return None
    name, function = found.rsplit(".", 1)
    return getattr(module(name), function)


def to_vllm(source: DrafterSource, target: Target, out: Path, mask_token_id: int | None = None) -> Conversion:
    """A specbench drafter directory -> the layout vLLM's method for its strategy loads (the table above)."""
    if _vllm_as_is(source):
        raise SpecbenchError(f"{source.checkpoint.name} is {source.format}, which vLLM loads as it is: "
                             f"give it to vLLM directly")
    if source.format != SPECBENCH:
        raise _refuse(source.checkpoint.name, f"{source.format} has no vLLM layout")
    write = _writer(source.strategy)
    if write is None:
        method = definition(source.strategy) if source.strategy in DRAFTER_NAMES else None
        raise _refuse(f"a specbench {source.strategy} drafter",
                      (method and method.no_vllm_drafter) or "vLLM has no method for it")
    return write(source, target, out, mask_token_id)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in (CONFIG, WEIGHTS):
        h.update((path / name).read_bytes())
    return h.hexdigest()[:16]


def vllm_drafter_dir(strategy: str, drafter_dir: Path | None, target: Target, cache_root: Path) -> Path:
    """The directory to give vLLM as `speculative_config["model"]` for `strategy` on `target`.

    `drafter_dir` is a --drafter directory, or None for the embedded default's drafter. Published
    checkpoints and draft LMs are returned as they are; specbench drafters are written under
    `cache_root/<strategy>-<hash of the drafter's files and the target's fingerprint>` on the first call
    and re-used after. ngram needs no directory (vLLM's `ngram` method).
    """
    method = definition(strategy)
    if not method.vllm_drafter:
        raise _refuse(f"strategy {strategy}", method.no_vllm_drafter or "vLLM has no drafter method for it")
    path = Path(default_drafter_dir(target, strategy, drafter_dir))
    if _writer(strategy) is None:  # a causal LM, which vLLM loads as it is
        return path
    source = open_source(path)
    if _vllm_as_is(source):
        return path
    key = hashlib.sha256(f"{_digest(path)}{fingerprint(target.model)}".encode()).hexdigest()[:16]
    out = Path(cache_root) / f"{strategy}-{key}"
    if not (out / CONFIG).is_file():
        with atomic_path(out) as staging:
            to_vllm(source, target, staging)
            write_json(staging / "specbench_source.json",
                       {"drafter": str(path), "strategy": strategy, "target_fingerprint": fingerprint(target.model)})
    return out
