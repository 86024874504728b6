"""The fast forward: Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) run as flat functions over a
preallocated KV cache, instead of transformers' modules over a DynamicCache.

On a small model, transformers' per-call machinery (kwargs plumbing, mask construction, output
capture, a module call per norm and projection) and the DynamicCache's concatenation of every
layer's keys at every step cost more than the matrix products. Here a forward is transformers'
arithmetic in about half the tensor calls: q/k/v and gate/up each one matrix product, q and k normed
and rotated together, torch's fused RMSNorm in float32 (the rotary embedding is the model's own
module). The matrix products are decoding/linear.py's (on a CPU, oneDNN over weights packed once); with
F.linear's (`packing(False)`) the logits equal transformers' bit for bit, which tests/test_engine.py
checks. The cache writes in place into buffers that double when full; crop and compaction are index
operations on them.

Only full-attention layers of those architectures with the silu MLP take this path (`supports`);
any other target, and every target when the fast path is off, runs transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbench.decoding.linear import linear

ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
INITIAL_CAPACITY = 256


def supports(model: torch.nn.Module) -> bool:
    config = model.config
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (config.model_type in ARCHITECTURES and types == {"full_attention"}
            and not getattr(config, "sliding_window", None) and config.hidden_act == "silu"
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "_attn_implementation", "sdpa") == "sdpa"
            and hasattr(getattr(model, "model", None), "layers") and hasattr(model, "lm_head"))


class StaticKV:
    """Keys and values of every layer in buffers (batch, kv_heads, capacity, head_dim); positions
    [0, length) are live. Writes go in place; a full buffer doubles."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.layers = layers
        self.length = 0

    def _reserve(self, key: torch.Tensor, value: torch.Tensor, needed: int) -> None:
        capacity = self.keys[0].shape[2] if self.keys else 0
        if needed <= capacity:
            return
        size = max(INITIAL_CAPACITY, capacity)
        while size < needed:
            size *= 2
        batch = key.shape[0]

        def grown(old: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            new = like.new_zeros(batch, like.shape[1], size, like.shape[3])
            if old is not None and self.length:
                new[:, :, :self.length] = old[:, :, :self.length]
            return new

        olds = list(zip(self.keys, self.values)) or [(None, None)] * self.layers
        self.keys = [grown(k, key) for k, _ in olds]
        self.values = [grown(v, value) for _, v in olds]

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `key`/`value` (batch, kv_heads, new, head_dim) after the live positions; the live
        keys/values with them. The length moves on once every layer has written (`advance`)."""
        end = self.length + key.shape[2]
        if layer == 0:
            self._reserve(key, value, end)
        self.keys[layer][:, :, self.length:end] = key
        self.values[layer][:, :, self.length:end] = value
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def live(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, :, :self.length], v[:, :, :self.length]) for k, v in zip(self.keys, self.values)]


@dataclass
class FlatOutput:
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None


def fuse(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears that read the same input: one matrix product instead of
    several, with the same outputs. The linears' own parameters become views into it (no second copy)."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    biases = [linear.bias for linear in linears]
    if any(b is None for b in biases) != all(b is None for b in biases):
        raise ValueError("fuse: either every linear has a bias or none has")
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    start = 0
    for layer in linears:
        end = start + layer.out_features
        layer.weight.data = weight[start:end]
        if bias is not None:
            layer.bias.data = bias[start:end]
        start = end
    return weight, bias


def qk_weight(q_norm: torch.nn.Module, k_norm: torch.nn.Module, heads: int, kv_heads: int) -> torch.Tensor:
    """(heads + kv_heads, head_dim): q's norm weight per query head, then k's per key head."""
    return torch.stack([q_norm.weight] * heads + [k_norm.weight] * kv_heads)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm; in float32 torch's fused kernel, which gives the same values in one call."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, weight.shape, weight, eps)
        return weight * F.rms_norm(x, weight.shape[-1:], None, eps)  # a weight per head
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def causal_mask(cached: int, new: int, device: torch.device) -> torch.Tensor:
    """(1, 1, new, cached + new) bool: query j sees keys up to cached + j."""
    keys, queries = torch.arange(cached + new, device=device), cached + torch.arange(new, device=device)
    return (keys[None] <= queries[:, None])[None, None]


class FlatLM:
    """A transformers Llama-family causal LM's weights, run by `forward`."""

    def __init__(self, model: torch.nn.Module):
        config = model.config
        self.model = model
        self.eps = config.rms_norm_eps
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.rotary = model.model.rotary_emb
        self.embed = model.model.embed_tokens.weight
        self.norm = model.model.norm.weight
        self.head = model.lm_head.weight
        self.layers = [self._layer(layer) for layer in model.model.layers[:config.num_hidden_layers]]
        self.scaling = model.model.layers[0].self_attn.scaling

    @staticmethod
    def _layer(layer: torch.nn.Module) -> dict:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        return {"ln1": layer.input_layernorm.weight, "ln2": layer.post_attention_layernorm.weight,
                "qkv": fuse(attn.q_proj, attn.k_proj, attn.v_proj), "o": (attn.o_proj.weight, attn.o_proj.bias),
                "qk_norm": None if q_norm is None else qk_weight(q_norm, k_norm, heads, kv_heads),
                "gate_up": fuse(mlp.gate_proj, mlp.up_proj)[0], "down": mlp.down_proj.weight}

    def new_cache(self) -> StaticKV:
        return StaticKV(len(self.layers))

    def _attention(self, x: torch.Tensor, w: dict, index: int, cache: StaticKV, cos: torch.Tensor,
                   sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, new, _ = x.shape
        qkv = linear(x, *w["qkv"]).view(batch, new, -1, self.head_dim)
        qk, v = qkv[:, :, :self.heads + self.kv_heads], qkv[:, :, self.heads + self.kv_heads:]
        if w["qk_norm"] is not None:  # one norm for q's heads and k's (each head normed on its own)
            qk = rms_norm(qk, w["qk_norm"], self.eps)
        qk = qk.transpose(1, 2)
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, :self.heads], qk[:, self.heads:], v.transpose(1, 2)
        keys, values = cache.write(index, k, v)
        groups = self.heads // self.kv_heads
        if mask is None and groups > 1:  # as transformers' sdpa: GQA in the kernel only without a mask
            out = F.scaled_dot_product_attention(q, keys, values, scale=self.scaling, enable_gqa=True)
        else:
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                values = values.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
        return linear(out.transpose(1, 2).reshape(batch, new, -1), *w["o"])

    def forward(self, input_ids: torch.Tensor, cache: StaticKV, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                logits_to_keep: int = 0) -> FlatOutput:
        """transformers' forward over (batch, new) tokens after the cache's live positions: the
        logits (of the last `logits_to_keep` positions; 0: all), and with output_hidden_states
        transformers' hidden_states tuple (each layer's input, then the final norm's output). A mask
        given is additive or bool, (batch, 1, new, cached + new)."""
        cached, new = cache.length, input_ids.shape[1]
        if position_ids is None:
            position_ids = (cached + torch.arange(new, device=input_ids.device))[None]
        if attention_mask is None and new > 1:
            attention_mask = causal_mask(cached, new, input_ids.device)
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.rotary(x, position_ids)
        cos, sin = cos[:, None], sin[:, None]
        hidden = []
        for index, w in enumerate(self.layers):
            if output_hidden_states:
                hidden.append(x)
            x = x + self._attention(rms_norm(x, w["ln1"], self.eps), w, index, cache, cos, sin, attention_mask)
            h = rms_norm(x, w["ln2"], self.eps)
            gate, up = linear(h, w["gate_up"]).chunk(2, -1)
            x = x + linear(F.silu(gate) * up, w["down"])
        cache.length += new
        x = rms_norm(x, self.norm, self.eps)
        if output_hidden_states:
            hidden.append(x)
        return FlatOutput(linear(x[:, -logits_to_keep:], self.head), tuple(hidden) if output_hidden_states else None)
