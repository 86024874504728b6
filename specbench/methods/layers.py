"""Building blocks shared by the feature drafters (eagle, mtp, dflash, dspark): a decoder block
with a target layer's attention shape and an MLP of 2H, RoPE, and frozen use of the target's embedding and LM head."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specbench.decoding.linear import Linear, linear

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values: (batch, kv_heads, rows, head_dim)


@dataclass(frozen=True)
class Arch:
    """One drafter decoder block, shaped like a layer of the target."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def of(cls, config) -> Arch:
        rope = getattr(config, "rope_parameters", None) or {}
        heads = config.num_attention_heads
        return cls(config.hidden_size, heads, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.intermediate_size,
                   config.rms_norm_eps, float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))

    @classmethod
    def drafter_block(cls, config) -> Arch:
        """A target layer's attention shape with an MLP of 2H: DFlash's draft-layer width, used by every
        feature drafter so that the four of them stay small beside the target."""
        arch = cls.of(config)
        return dataclasses.replace(arch, intermediate_size=2 * arch.hidden_size)


@functools.lru_cache(maxsize=16)
def rope_table(head_dim: int, theta: float, length: int, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of positions 0 .. length - 1, (length, head_dim), computed in float32; built once per
    length, so that a drafting step indexes rows instead of recomputing them (a dozen tensor calls)."""
    with torch.inference_mode(False), torch.no_grad():  # usable by training as well as by drafting
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
        freqs = torch.arange(length, device=device)[:, None].float() * inv_freq
        freqs = torch.cat([freqs, freqs], -1)
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (rows, head_dim): rows of a table whose length doubles as positions grow."""
    length = 1 << max(10, int(positions.max()).bit_length()) if len(positions) else 1
    cos, sin = rope_table(head_dim, theta, length, dtype, positions.device)
    return cos[positions], sin[positions]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
    """A pre-norm decoder block: RoPE attention (GQA) then a SwiGLU MLP."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.arch = arch
        h, q, kv = arch.hidden_size, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        self.attn_norm = nn.RMSNorm(h, eps=arch.rms_norm_eps)
        self.wqkv = Linear(h, q + 2 * kv, bias=False)
        self.wo = Linear(q, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=arch.rms_norm_eps)
        self.w13 = Linear(h, 2 * arch.intermediate_size, bias=False)
        self.w2 = Linear(arch.intermediate_size, h, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """x (B, T, H) at `positions` (T,); mask (T, S) or (B, 1, T, S), bool or additive, over the
        S = past + T keys. Returns the output and the keys/values of past and these rows."""
        a = self.arch
        b, t, _ = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).split(
            [a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim], -1)
        q = q.view(b, t, a.num_heads, a.head_dim).transpose(1, 2)
        k = k.view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
        v = v.view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
        cos, sin = rope(positions, a.head_dim, a.rope_theta, x.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=a.num_kv_heads != a.num_heads)
        x = x + self.wo(out.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, -1)
        return x + self.w2(F.silu(gate) * up), (k, v)


class FeatureLayer(nn.Module):
    """norm(embedding of the next token) ++ norm(feature) -> 2H -> H -> one decoder block.

    `out_norm` is applied before the target's LM head; the block output itself is what is fed
    forward (EAGLE's next feature, MTP's next module's hidden)."""

    def __init__(self, arch: Arch):
        super().__init__()
        h = arch.hidden_size
        self.embed_norm = nn.RMSNorm(h, eps=arch.rms_norm_eps)
        self.feature_norm = nn.RMSNorm(h, eps=arch.rms_norm_eps)
        self.proj = Linear(2 * h, h, bias=False)
        self.block = Block(arch)
        self.out_norm = nn.RMSNorm(h, eps=arch.rms_norm_eps)

    def forward(self, feature: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: KV | None = None) -> tuple[torch.Tensor, KV]:
        dtype = self.proj.weight.dtype  # a drafter drafting in bfloat16 takes the target's float32 states
        x = self.proj(torch.cat([self.embed_norm(embeds.to(dtype)), self.feature_norm(feature.to(dtype))], -1))
        return self.block(x, positions, mask, past)


# The target's embedding and LM head are used with detached weights: frozen, and not part of the
# drafter's state_dict.
def embed(target_model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return F.embedding(tokens, target_model.get_input_embeddings().weight.detach())


def lm_head(target_model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    head = target_model.get_output_embeddings()
    if torch.is_grad_enabled():  # training a drafter: the head stays frozen
        return F.linear(hidden, head.weight.detach(), None if head.bias is None else head.bias.detach())
    return linear(hidden, head.weight, head.bias)


def causal_mask(start: int, rows: int, device: torch.device) -> torch.Tensor:
    """(rows, start + rows) bool: rows start.. see every earlier row and themselves."""
    return torch.ones(rows, start + rows, dtype=torch.bool, device=device).tril(start)
