"""MTP modules shipped inside the target's own checkpoint, run by methods/mtp.py's drafter.

Layouts (the target's config.json gives the count, its weight names the layout):
- DeepSeek-V3: `model.layers.{L+k}.{enorm, hnorm, eh_proj, shared_head.norm}` plus a decoder block
  of the target's own kind, `num_nextn_predict_layers`;
- Qwen3-Next: `mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.k, norm}`,
  `mtp_num_hidden_layers` (its block a full-attention layer);
- MiMo: `model.mtp_layers.{k}.{token_layernorm, hidden_layernorm, input_proj, final_layernorm}` plus
  the block, `num_nextn_predict_layers`; its projection reads [hidden, embedding] in that order.

Module k maps the previous hidden state h (the target's final normed state for k = 1, module
k - 1's output after) and the embedding of the next token to
h' = post_norm(block(proj(cat(norm(embedding), norm(h))))), and the target's LM head maps h' to the
logits of the token after. The network is transformers' own MtpModel (modeling_layers.py): its
MtpLayer around the target's decoder-layer class and norm, loaded through its weight conversions
(renamed layouts, fused experts). methods/mtp.py drives it: module k runs over its own rows and
cache, and `mtp.n_modules` is at most the modules the checkpoint has (vLLM and SGLang can also
chain one module for several steps; that is not done here).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.kv_cache import cache_keyword, layer_cache, layer_kv
from specbench.methods.drafter_config import read_drafter_config
from specbench.methods.layers import KV, lm_head
from specbench.methods.mtp import MtpDrafter, MtpOptions
from specbench.methods.published.checkpoint import Checkpoint
from specbench.methods.published.formats import DrafterSource

COUNT_KEYS = ("num_mtp_layers", "num_nextn_predict_layers", "mtp_num_hidden_layers")
MIMO_NAMES = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj",
              "final_layernorm": "shared_head.norm"}


def declared_modules(config: dict) -> int:
    """The MTP modules a config.json declares (transformers' config classes default some of these to 1)."""
    return max(int(config.get(key) or 0) for key in COUNT_KEYS)


def target_checkpoint(target_model: nn.Module) -> Checkpoint | None:
    """The directory the target was loaded from (a hub id's cached snapshot), None for a model built in memory."""
    path = Path(getattr(target_model.config, "_name_or_path", None) or "")
    if not (path / "config.json").is_file():
        return None
    return Checkpoint(path, None, read_drafter_config(path, str(path)))


def layout(names: set[str], num_layers: int) -> str | None:
    if any(n.startswith("mtp.") for n in names):
        return "mtp-qwen3-next"
    if any(n.startswith("model.mtp_layers.") for n in names):
        return "mtp-mimo"
    if any(n.startswith(f"model.layers.{num_layers}.") for n in names):
        return "mtp-deepseek-v3"
    return None


def builtin_source(target) -> DrafterSource | None:
    """The target's own MTP modules, when its config declares some; None when it declares none."""
    checkpoint = target_checkpoint(target.model)
    if checkpoint is None or declared_modules(checkpoint.config) < 1:
        return None
    fmt = layout(checkpoint.weight_names(), target.model.config.num_hidden_layers)
    if fmt is None:
        raise SpecbenchError(f"target {target.name}: its config declares {declared_modules(checkpoint.config)} MTP "
                             "modules, but "
                             "no MTP weights (mtp.*, model.mtp_layers.* or model.layers.L+k) were found in its "
                             "checkpoint")
    return DrafterSource("mtp", fmt, checkpoint)


def knob_defaults(source: DrafterSource) -> dict:
    """All of the checkpoint's modules (mtp.n_modules defaults to 3, more than most targets ship)."""
    return {"n_modules": declared_modules(source.checkpoint.config)}


def mtp_names(source: DrafterSource, num_layers: int) -> dict[str, str]:
    """The checkpoint's MTP weight names -> the names transformers' MtpModel conversions expect."""
    names = source.checkpoint.weight_names()
    if source.format == "mtp-qwen3-next":
        return {n: n for n in names if n.startswith("mtp.")}
    if source.format == "mtp-deepseek-v3":
        layer = (re.match(r"model\.layers\.(\d+)\.", n) for n in names)
        return {m.string: m.string for m in layer if m and int(m[1]) >= num_layers}
    out = {}
    for n in names:
        match = re.match(r"model\.mtp_layers\.(\d+)\.([^.]+)\.(.+)$", n)
        if match:
            k, module, rest = match.groups()
            out[n] = f"model.layers.{num_layers + int(k)}.{MIMO_NAMES.get(module, module)}.{rest}"
    return out


@contextmanager
def mtp_config(config, count: int, hidden_first: bool):
    """The config fields transformers' MtpModel reads, set for its construction only (the target's config
    object is left as it was)."""
    wanted = {"num_mtp_layers": count, "mtp_hidden_states_first": hidden_first}
    if getattr(config, "layer_types", None) is not None:
        wanted["mtp_layer_types"] = ["full_attention"] * count
    saved = {key: getattr(config, key) for key in wanted if hasattr(config, key)}
    for key, value in wanted.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key in wanted:
            if key in saved:
                setattr(config, key, saved[key])
            else:
                delattr(config, key)


class BlockAdapter(nn.Module):
    """One transformers MtpLayer behind the call methods/mtp.py makes of a module:
    (feature, embeddings, positions, bool mask over past + new rows, past keys/values) -> (output, keys/values)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, index: int):
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "rotary", rotary)  # the target's, not this module's
        self.index = index

    def forward(self, feature: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        cache = layer_cache(self.index, past)
        additive = torch.zeros(mask.shape, dtype=feature.dtype, device=feature.device)
        additive = additive.masked_fill(~mask, torch.finfo(feature.dtype).min)[None, None]
        out = self.layer(embeds.to(feature.dtype), feature, position_embeddings=self.rotary(feature, positions[None]),
                         attention_mask=additive, position_ids=positions[None],
                         **{cache_keyword(type(self.layer)): cache})
        return out, layer_kv(cache, self.index)


class BuiltinMtpModel(nn.Module):
    """The interface MtpDrafter drives: `layers` (one per module), `logits`, `hidden_layers`, `arch`, `target`.
    Only the modules' own weights are registered: the embedding and LM head they share are the target's."""

    def __init__(self, target_model: nn.Module, mtp: nn.Module):
        super().__init__()
        object.__setattr__(self, "target", target_model)
        rotary = target_model.get_decoder().rotary_emb
        self.layers = nn.ModuleList(BlockAdapter(layer, rotary, k) for k, layer in enumerate(mtp.layers))
        self.hidden_layers = (target_model.config.num_hidden_layers,)
        self.arch = target_model.config  # MtpDrafter reads arch.hidden_size

    def logits(self, module: int, hidden: torch.Tensor) -> torch.Tensor:
        return lm_head(self.target, hidden)


def _loading_problem(info) -> str | None:
    """The first missing, unexpected or misshapen weight of a transformers loading report."""
    from transformers.modeling_layers import MtpModel

    missing = sorted(set(info.missing_keys) - set(MtpModel._keys_to_ignore_on_load_missing))
    if missing:
        return f"MTP weight {missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    unexpected = sorted(k for k in info.unexpected_keys
                        if not any(k.endswith(i) for i in MtpModel._keys_to_ignore_on_load_unexpected))
    if unexpected:
        return f"MTP weight {unexpected[0]} does not belong to an MTP module"
    if info.mismatched_keys:
        key, *shapes = sorted(info.mismatched_keys)[0]
        return f"MTP weight {key} has the wrong shape ({' vs '.join(str(tuple(s)) for s in shapes)})"
    return None


def weight_conversions(mtp, target_model) -> list:
    """transformers' renamings of a checkpoint's MTP weights onto its MtpModel: MtpModel.get_weight_conversions
    from transformers 5.2x on; before it (5.19, which vLLM pins), the same three steps written out."""
    if hasattr(mtp, "get_weight_conversions"):
        return mtp.get_weight_conversions(target_model)
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    layers = target_model.config.get_text_config().num_hidden_layers
    renamed = [WeightRenaming(source_patterns=f"layers.{n}.", target_patterns=f"layers.{n - layers}.mtp_block.")
               for n in range(layers, layers + mtp.num_mtp_layers)]
    # Qwen3-Next's single module keeps fc / pre_fc_norm_* / norm one level up (5.2x's MtpModel rules)
    single = [WeightRenaming(source_patterns=r"^layers\.(\d+)\.(?!(?:mtp_block|enorm|hnorm|eh_proj|post_norm)\.)",
                             target_patterns=r"layers.\1.mtp_block."),
              WeightRenaming(source_patterns=r"^fc\.", target_patterns="layers.0.eh_proj."),
              WeightRenaming(source_patterns=r"^pre_fc_norm_embedding\.", target_patterns="layers.0.enorm."),
              WeightRenaming(source_patterns=r"^pre_fc_norm_hidden\.", target_patterns="layers.0.hnorm."),
              WeightRenaming(source_patterns=r"^norm\.", target_patterns="layers.0.post_norm.")]
    main = getattr(target_model, "_weight_conversions", None) or get_model_conversion_mapping(target_model)
    return renamed + get_model_conversion_mapping(mtp, add_legacy=False) + single + main


def build_mtp(source: DrafterSource, target_model: nn.Module) -> BuiltinMtpModel:
    """transformers' MtpModel for the target, loaded from the target's own checkpoint."""
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_layers import MtpModel
    from transformers.modeling_utils import LoadStateDictConfig
    from transformers.utils import ContextManagers

    config = target_model.config
    count = declared_modules(source.checkpoint.config)
    if source.checkpoint.config.get("mtp_use_dedicated_embeddings"):
        raise SpecbenchError(f"target {source.checkpoint.name}: MTP modules with their own embeddings "
                             "(mtp_use_dedicated_embeddings) are not supported")
    renamed = mtp_names(source, config.num_hidden_layers)
    state = {renamed[k]: v for k, v in source.checkpoint.load(renamed).items()}
    # built as transformers' own MtpModel.from_pretrained builds it: in the target's dtype, on the meta device
    # until the weights are loaded (a DeepSeek-V3 MTP layer holds billions of parameters)
    init = ContextManagers(MtpModel.get_init_context(target_model.dtype, False, False, None))
    with mtp_config(config, count, hidden_first=source.format == "mtp-mimo"), init:
        mtp = MtpModel(target_model, count)
    info, _ = convert_and_load_state_dict_in_model(
        model=mtp, state_dict=state,
        load_config=LoadStateDictConfig(weight_mapping=weight_conversions(mtp, target_model),
                                        dtype=target_model.dtype))
    problem = _loading_problem(info)
    unset = next((n for n, t in [*mtp.named_parameters(), *mtp.named_buffers()] if t.is_meta), None)
    if problem is None and unset is not None:
        problem = f"MTP weight {unset} was not loaded"
    if problem:
        raise SpecbenchError(f"target {source.checkpoint.name}: {problem} (named as transformers' MtpModel names it)")
    mtp.tie_with_main_model(target_model)
    return BuiltinMtpModel(target_model, mtp.to(target_model.device, target_model.dtype).eval())


def load(source: DrafterSource, target, options: MtpOptions) -> MtpDrafter:
    return MtpDrafter(build_mtp(source, target.model).eval(), options)
