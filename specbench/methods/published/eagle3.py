"""EAGLE-3 checkpoints as SafeAILab/EAGLE (eagle/model/cnets.py) and SpecForge ship them, behind the
EAGLE-2 dynamic tree of methods/eagle.py.

The network: `fc` fuses the target's hidden states at the inputs of layers 2, L//2 and L-3 (HF
`hidden_states` indices 2, L//2, L-3; `eagle_config.eagle_aux_hidden_state_layer_ids` overrides
them) into the feature f. One decoder layer `midlayer` then takes
cat(input_layernorm(embedding of the next token), hidden_norm(f)): q/k/v read those 2H inputs, the
residual is f itself, then post_attention_layernorm and the MLP. `norm` and `lm_head` give logits
over the reduced draft vocabulary; draft id i is target id i + d2t[i]. Deeper tree levels feed the
midlayer output back as f. The token embedding is the target's (`embed_tokens.weight` in the
checkpoint is used instead where there is one, as for a `target_hidden_size` drafter).

vLLM's EAGLE-3 (llama_eagle3.py) also runs drafters of several layers: `layers.0` is the midlayer,
`layers.1..` are plain pre-norm Llama decoder layers over the running residual, and `norm` takes their
sum. `norm_before_residual` makes the midlayer's residual hidden_norm(f) instead of f;
`attention_bias` gives q/k/v/o biases. Sliding-window layers are not read (vLLM's EAGLE-3 keeps all
draft layers in one KV-cache group, so it refuses them too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from specbench.core.errors import SpecbenchError
from specbench.decoding.linear import Linear
from specbench.methods.base import drafting_dtype
from specbench.methods.eagle import EagleDrafter, EagleOptions
from specbench.methods.layers import KV, embed, rotate
from specbench.methods.published.common import Rotary, check_equal, hf_config, load_into, target_vocab
from specbench.methods.published.formats import DrafterSource


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """HF hidden-state indices of the inputs of target layers 2, L//2 and L-3 (EAGLE-3's choice)."""
    return (2, num_layers // 2, num_layers - 3)


class Attention(nn.Module):
    def __init__(self, config, inputs: int):
        super().__init__()
        h = config.hidden_size
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.heads
        bias = bool(getattr(config, "attention_bias", False))  # q, k, v and o, as in Llama
        self.q_proj = Linear(inputs, self.heads * self.head_dim, bias=bias)
        self.k_proj = Linear(inputs, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(inputs, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.heads * self.head_dim, h, bias=bias)

    def forward(self, x: torch.Tensor, cos_sin, mask: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class Mlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, 2 * h)
        self.mlp = Mlp(config)
        self.hidden_norm = nn.RMSNorm(h, eps=eps)
        self.input_layernorm = nn.RMSNorm(h, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, feature: torch.Tensor, embeds: torch.Tensor, cos_sin, mask: torch.Tensor,
                past: KV | None) -> tuple[torch.Tensor, KV]:
        normed = self.hidden_norm(feature)
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        attn, kv = self.self_attn(x, cos_sin, mask, past)
        h = (normed if self.norm_before_residual else feature) + attn
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class DecoderLayer(nn.Module):
    """vLLM's EAGLE-3 layers after the first: a plain pre-norm Llama decoder layer."""

    def __init__(self, config):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, h)
        self.mlp = Mlp(config)
        self.input_layernorm = nn.RMSNorm(h, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)

    def forward(self, x: torch.Tensor, cos_sin, mask: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        attn, kv = self.self_attn(self.input_layernorm(x), cos_sin, mask, past)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), kv


def specbench_name(key: str) -> str:
    """vLLM's multi-layer names (layers.0 the midlayer, layers.k) as Eagle3Model calls them."""
    parts = key.split(".")
    if parts[0] != "layers" or len(parts) < 3:
        return key
    k = int(parts[1])
    return ".".join(["midlayer"] if k == 0 else ["layers", str(k - 1)]) + "." + ".".join(parts[2:])


def published_name(key: str) -> str:
    """A weight name of Eagle3Model as the checkpoint calls it (the midlayer as SafeAILab names it)."""
    parts = key.split(".")
    if parts[0] == "layers":
        return ".".join(["layers", str(int(parts[1]) + 1), *parts[2:]])
    return key


class Eagle3Model(nn.Module):
    """The published network, with the interface EagleDrafter drives (fc, step, logits, draft_ids, hidden_layers)."""

    def __init__(self, target_model: nn.Module, config, hidden_layers: tuple[int, ...], own_embedding: bool):
        super().__init__()
        object.__setattr__(self, "target", target_model)  # held, not registered
        h = config.hidden_size
        vocab, draft_vocab = config.vocab_size, getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.hidden_layers = hidden_layers
        feature_width = getattr(config, "target_hidden_size", None) or h
        self.fc = Linear(len(hidden_layers) * feature_width, h, bias=False)
        self.midlayer = MidLayer(config)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers - 1))
        self.norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = Linear(h, draft_vocab, bias=False)
        self.embed_tokens = nn.Embedding(vocab, h) if own_embedding else None
        if draft_vocab != vocab:
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool))
        self.rotary = Rotary(config)

    def step(self, feature: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             past: tuple[KV, ...] | None = None) -> tuple[torch.Tensor, tuple[KV, ...]]:
        """The last layer's output and every layer's keys/values (`past`: theirs for the earlier rows)."""
        embeds = self.embed_tokens(tokens) if self.embed_tokens is not None else embed(self.target, tokens)
        cos_sin = self.rotary(positions, feature.dtype)
        past = past or (None,) * (1 + len(self.layers))
        x, kv = self.midlayer(feature, embeds.to(feature.dtype), cos_sin, mask, past[0])
        kvs = [kv]
        for layer, layer_past in zip(self.layers, past[1:]):
            x, kv = layer(x, cos_sin, mask, layer_past)
            kvs.append(kv)
        return x, tuple(kvs)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary: draft id i is target id `draft_ids[i]` (i + d2t[i])."""
        return self.lm_head(self.norm(hidden))

    @property
    def draft_ids(self) -> torch.Tensor | None:
        return getattr(self, "target_ids", None)


def check_d2t(state: dict[str, torch.Tensor], vocab: int, name: str) -> None:
    d2t = state.get("d2t")
    if d2t is None:
        return
    target_ids = torch.arange(len(d2t)) + d2t.long()
    if target_ids.min() < 0 or target_ids.max() >= vocab or len(target_ids.unique()) != len(target_ids):
        raise SpecbenchError(f"drafter {name}: d2t does not map the draft vocabulary to distinct target ids "
                             f"below {vocab}")


def knob_defaults(source: DrafterSource) -> dict:
    """None: an EAGLE-3 checkpoint runs with specbench's eagle knob defaults."""
    return {}


def load(source: DrafterSource, target, options: EagleOptions) -> EagleDrafter:
    name, raw = source.checkpoint.name, source.checkpoint.config
    config = hf_config(raw, name)
    target_config = target.model.config
    check_equal(name, "target hidden size", getattr(config, "target_hidden_size", None) or config.hidden_size,
                target_config.hidden_size)
    check_equal(name, "vocabulary size", config.vocab_size, target_vocab(target.model))
    # concatenated in layer order, as the target's forward collects them
    layers = tuple(sorted((raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                          or eagle3_layers(target_config.num_hidden_layers)))
    if len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) >= target_config.num_hidden_layers:
        raise SpecbenchError(f"drafter {name}: EAGLE-3 reads the inputs of target layers {list(layers)}, which a "
                             f"{target_config.num_hidden_layers}-layer target does not have as distinct layers")
    state = {specbench_name(k): v for k, v in source.checkpoint.load(source.checkpoint.weight_names()).items()}
    model = Eagle3Model(target.model, config, layers, own_embedding="embed_tokens.weight" in state)
    if not hasattr(model, "d2t"):  # a full draft vocabulary: the maps are the identity (cnets drops them too)
        state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    if getattr(config, "target_hidden_size", None) and model.embed_tokens is None:
        raise SpecbenchError(f"drafter {name}: weight embed_tokens.weight is missing (a target_hidden_size drafter "
                             "has its own embedding)")
    check_d2t(state, config.vocab_size, name)
    load_into(model, state, name, published_name)
    if hasattr(model, "d2t"):  # the target id of each draft id, once, not at every tree level
        model.register_buffer("target_ids", torch.arange(len(model.d2t)) + model.d2t, persistent=False)
    return EagleDrafter(model.to(target.device, drafting_dtype(target)).eval(), options)
