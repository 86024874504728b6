"""Tiny checkpoints in the layouts their authors publish (config keys and weight names as published,
random weights), and independent evaluations of them written from each format's definition.

The references below share no code with specbench/methods/published/: attention, RoPE, norms and
heads are written out here, so a wrong layer index, a missing norm or a swapped concatenation in the
implementation makes the proposals differ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

# ---------------------------------------------------------------------------------------------------
# plain math


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (heads, n, d) rotated by the default RoPE at `positions` (n,): halves rotated, as Llama/Qwen do."""
    d = x.shape[-1]
    freqs = positions[:, None].double() / theta ** (torch.arange(0, d, 2).double() / d)
    cos, sin = torch.cat([freqs.cos()] * 2, -1).float(), torch.cat([freqs.sin()] * 2, -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q (heads, n, d), k/v (kv_heads, s, d), visible (n, s) bool -> (n, heads * d)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    out = scores.masked_fill(~visible, -math.inf).softmax(-1) @ v
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.view(x.shape[0], n, -1).transpose(0, 1)


def swiglu(x: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    return (F.silu(x @ w[f"{prefix}gate_proj.weight"].T) * (x @ w[f"{prefix}up_proj.weight"].T)) @ \
        w[f"{prefix}down_proj.weight"].T


def target_states(model, prompt: list[int]) -> tuple[torch.Tensor, ...]:
    """HF hidden_states of every prompt token but the last (what the engine hands a drafter)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states


def propose(drafter, model, prompt: list[int], budget: int):
    """The drafter's first proposal after `prompt` (greedy, a fixed budget), as the engine would ask for it."""
    from specbench.decoding.drafting import DraftContext
    from specbench.decoding.sampling import Sampling, seeded
    from specbench.methods.controllers import FixedController

    states = target_states(model, prompt)
    drafter.start(torch.tensor(prompt), tuple(states[i][0] for i in drafter.hidden_layers))
    rng = seeded(0, torch.device("cpu"))
    return drafter.propose(DraftContext(torch.tensor(prompt), budget, Sampling(), rng, FixedController(budget)))


def write(path: Path, config: dict, state: dict[str, torch.Tensor], bin_format: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in state.items()}
    if bin_format:
        torch.save(state, path / "pytorch_model.bin")
    else:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    return torch.load(path / "pytorch_model.bin", weights_only=True)


def norm_weight(n: int, gen: torch.Generator) -> torch.Tensor:
    return 0.5 + torch.rand(n, generator=gen)


def linear(out: int, inp: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(out, inp, generator=gen) * scale / math.sqrt(inp)


# ---------------------------------------------------------------------------------------------------
# EAGLE-3 (SafeAILab/EAGLE eagle/model/cnets.py)

def eagle3_checkpoint(path: Path, target, draft_vocab: int, seed: int = 0, bin_format: bool = False,
                      heads_: int = 4, kv_heads: int = 2, hidden: int | None = None) -> Path:
    """`hidden` other than the target's: a `target_hidden_size` drafter, with its own embedding."""
    t = target.config
    h, vocab, gen = hidden or t.hidden_size, t.vocab_size, torch.Generator().manual_seed(seed)
    hd = h // heads_
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": 3 * h, "num_attention_heads": heads_, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu", "max_position_embeddings": 512,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    chosen = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    state = {"fc.weight": linear(h, 3 * t.hidden_size, gen),
             "midlayer.self_attn.q_proj.weight": linear(heads_ * hd, 2 * h, gen, 3.0),
             "midlayer.self_attn.k_proj.weight": linear(kv_heads * hd, 2 * h, gen, 3.0),
             "midlayer.self_attn.v_proj.weight": linear(kv_heads * hd, 2 * h, gen),
             "midlayer.self_attn.o_proj.weight": linear(h, heads_ * hd, gen),
             "midlayer.mlp.gate_proj.weight": linear(3 * h, h, gen),
             "midlayer.mlp.up_proj.weight": linear(3 * h, h, gen),
             "midlayer.mlp.down_proj.weight": linear(h, 3 * h, gen),
             "midlayer.hidden_norm.weight": norm_weight(h, gen),
             "midlayer.input_layernorm.weight": norm_weight(h, gen),
             "midlayer.post_attention_layernorm.weight": norm_weight(h, gen),
             "norm.weight": norm_weight(h, gen), "lm_head.weight": linear(draft_vocab, h, gen, 4.0),
             "d2t": chosen - torch.arange(draft_vocab),
             "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill(0, chosen, True)}
    if h != t.hidden_size:
        config["target_hidden_size"] = t.hidden_size
        state["embed_tokens.weight"] = torch.randn(vocab, h, generator=gen)
    return write(path, config, state, bin_format)


class Eagle3Reference:
    """EAGLE-3 evaluated directly: rows i = (feature of position i, token i + 1) at position i."""

    def __init__(self, target, path: Path):
        self.config = json.loads((path / "config.json").read_text())
        self.w = weights(path)
        self.target = target
        layers = target.config.num_hidden_layers
        self.layers = (2, layers // 2, layers - 3)  # inputs of layers 2, L//2, L-3

    def _layer(self, features: torch.Tensor, tokens: list[int], positions: torch.Tensor, visible: torch.Tensor,
               past: list[torch.Tensor]) -> torch.Tensor:
        """Midlayer rows (feature, token) attending `past` rows' (k, v) and each other as `visible` says."""
        c, w, eps = self.config, self.w, self.config["rms_norm_eps"]
        table = w.get("embed_tokens.weight", self.target.get_input_embeddings().weight)
        emb = table[torch.tensor(tokens)]
        x = torch.cat([rms(emb, w["midlayer.input_layernorm.weight"], eps),
                       rms(features, w["midlayer.hidden_norm.weight"], eps)], -1)
        q = rope(heads(x @ w["midlayer.self_attn.q_proj.weight"].T, c["num_attention_heads"]), positions, 1e4)
        k = rope(heads(x @ w["midlayer.self_attn.k_proj.weight"].T, c["num_key_value_heads"]), positions, 1e4)
        v = heads(x @ w["midlayer.self_attn.v_proj.weight"].T, c["num_key_value_heads"])
        if past:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        past[:] = [k, v]
        h = features + attention(q, k, v, visible) @ w["midlayer.self_attn.o_proj.weight"].T
        return h + swiglu(rms(h, w["midlayer.post_attention_layernorm.weight"], eps), w, "midlayer.mlp.")

    def logits(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft-vocabulary logits and the target ids they stand for."""
        w = self.w
        ids = torch.arange(len(w["d2t"])) + w["d2t"]
        return rms(h, w["norm.weight"], self.config["rms_norm_eps"]) @ w["lm_head.weight"].T, ids

    @torch.inference_mode()
    def first_two_levels(self, prompt: list[int], top_k: int) -> tuple[list[int], list[int]]:
        """Target ids of the root's top_k children, and of the best child's top_k children."""
        states = target_states(self.target, prompt)
        n = len(prompt)
        features = torch.cat([states[i][0] for i in self.layers], -1) @ self.w["fc.weight"].T
        past: list[torch.Tensor] = []
        rows = torch.arange(n - 1)
        out = self._layer(features, prompt[1:], rows, rows[:, None] >= rows[None, :], past)
        logits, ids = self.logits(out[-1])
        first = ids[logits.topk(top_k).indices].tolist()
        child = self._layer(out[-1:], first[:1], torch.tensor([n - 1]), torch.ones(1, n, dtype=torch.bool), past)
        logits, ids = self.logits(child[0])
        return first, ids[logits.topk(top_k).indices].tolist()


# ---------------------------------------------------------------------------------------------------
# DFlash (z-lab/dflash dflash/model.py) and DeepSpec's DFlash / DSpark (deepspec/modeling/dspark/)

def _qwen3_block_layers(state: dict, layers: int, h: int, heads_: int, kv_heads: int, gen: torch.Generator) -> None:
    hd = h // heads_
    for i in range(layers):
        p = f"layers.{i}."
        state.update({p + "self_attn.q_proj.weight": linear(heads_ * hd, h, gen, 2.0),
                      p + "self_attn.k_proj.weight": linear(kv_heads * hd, h, gen, 2.0),
                      p + "self_attn.v_proj.weight": linear(kv_heads * hd, h, gen),
                      p + "self_attn.o_proj.weight": linear(h, heads_ * hd, gen),
                      p + "self_attn.q_norm.weight": norm_weight(hd, gen),
                      p + "self_attn.k_norm.weight": norm_weight(hd, gen),
                      p + "input_layernorm.weight": norm_weight(h, gen),
                      p + "post_attention_layernorm.weight": norm_weight(h, gen),
                      p + "mlp.gate_proj.weight": linear(2 * h, h, gen),
                      p + "mlp.up_proj.weight": linear(2 * h, h, gen),
                      p + "mlp.down_proj.weight": linear(h, 2 * h, gen)})


def _arch(h: int, layers: int, vocab: int) -> dict:
    return {"model_type": "qwen3", "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": h // 4, "intermediate_size": 2 * h, "num_hidden_layers": layers, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False, "hidden_act": "silu",
            "max_position_embeddings": 4096, "tie_word_embeddings": False}


def dflash_checkpoint(path: Path, target, target_layer_ids: list[int], mask_token_id: int, block_size: int = 4,
                      layers: int = 2, seed: int = 0, sliding_window: int | None = None,
                      block_in_dflash_config: bool = False) -> Path:
    """z-lab's layout: block_size at the top level (older) or in dflash_config (newer, with window layers)."""
    t = target.config
    h, gen = t.hidden_size, torch.Generator().manual_seed(seed)
    dflash = {"mask_token_id": mask_token_id, "target_layer_ids": target_layer_ids}
    config = {"architectures": ["DFlashDraftModel"], **_arch(h, layers, t.vocab_size),
              "num_target_layers": t.num_hidden_layers, "dflash_config": dflash,
              "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}}
    if block_in_dflash_config:
        dflash["block_size"] = block_size
    else:
        config["block_size"] = block_size
    if sliding_window:
        config.update(layer_types=["sliding_attention"] + ["full_attention"] * (layers - 1),
                      sliding_window=sliding_window, use_sliding_window=True)
    state = {"fc.weight": linear(h, len(target_layer_ids) * h, gen), "hidden_norm.weight": norm_weight(h, gen),
             "norm.weight": norm_weight(h, gen)}
    _qwen3_block_layers(state, layers, h, 4, 2, gen)
    return write(path, config, state)


def deepspec_checkpoint(path: Path, target, target_layer_ids: list[int], mask_token_id: int, block_size: int = 5,
                        layers: int = 2, markov_rank: int = 8, markov_head_type: str = "vanilla",
                        confidence: bool = True, confidence_with_markov: bool = True, seed: int = 0) -> Path:
    """DeepSpec's Qwen3DSparkModel: the target's config copied, plus its own fields (markov_rank 0: DFlash)."""
    t = target.config
    h, vocab, gen = t.hidden_size, t.vocab_size, torch.Generator().manual_seed(seed)
    config = {**t.to_dict(), "architectures": ["Qwen3DSparkModel"], "num_target_layers": t.num_hidden_layers,
              "num_hidden_layers": layers, "block_size": block_size, "layer_types": ["full_attention"] * layers,
              "mask_token_id": mask_token_id, "target_layer_ids": target_layer_ids, "num_anchors": 512,
              "enable_confidence_head": confidence, "markov_rank": markov_rank, "tie_word_embeddings": False}
    if confidence:
        config["confidence_head_with_markov"] = confidence_with_markov
    if markov_rank:
        config["markov_head_type"] = markov_head_type
    state = {"embed_tokens.weight": torch.randn(vocab, h, generator=gen),
             "fc.weight": linear(h, len(target_layer_ids) * h, gen), "hidden_norm.weight": norm_weight(h, gen),
             "norm.weight": norm_weight(h, gen), "lm_head.weight": linear(vocab, h, gen, 4.0)}
    _qwen3_block_layers(state, layers, h, t.num_attention_heads, t.num_key_value_heads, gen)
    r = markov_rank
    if r:
        state["markov_head.markov_w1.weight"] = torch.randn(vocab, r, generator=gen)
        state["markov_head.markov_w2.weight"] = linear(vocab, r, gen, 2.0)
        if markov_head_type == "gated":
            state["markov_head.gate_proj.weight"] = linear(r, h + r, gen)
            state["markov_head.gate_proj.bias"] = torch.randn(r, generator=gen)
        if markov_head_type == "rnn":
            state["markov_head.joint_proj.weight"] = linear(3 * r, 2 * r + h, gen)
            state["markov_head.joint_proj.bias"] = torch.randn(3 * r, generator=gen)
    if confidence:
        state["confidence_head.proj.weight"] = linear(1, h + (r if confidence_with_markov else 0), gen, 3.0)
        state["confidence_head.proj.bias"] = torch.randn(1, generator=gen)
    return write(path, config, state)


class BlockReference:
    """One drafting block of a z-lab or DeepSpec checkpoint, evaluated directly."""

    def __init__(self, target, path: Path):
        self.config = json.loads((path / "config.json").read_text())
        self.w = weights(path)
        self.target = target
        self.deepspec = "markov_rank" in self.config
        c = self.config
        dflash = c.get("dflash_config") or {}
        self.ids = c["target_layer_ids"] if self.deepspec else dflash["target_layer_ids"]
        self.mask = c["mask_token_id"] if self.deepspec else dflash["mask_token_id"]
        self.window = c.get("sliding_window") if "sliding_attention" in c.get("layer_types", []) else None

    def hidden(self, prompt: list[int], block_size: int) -> torch.Tensor:
        """(block_size, H): the final normed states of the block [last token, mask x (B - 1)]."""
        c, w = self.config, self.w
        eps, heads_, kv = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        states = target_states(self.target, prompt)
        n = len(prompt)
        ctx = torch.cat([states[i + 1][0] for i in self.ids], -1) @ w["fc.weight"].T
        ctx = rms(ctx, w["hidden_norm.weight"], eps)
        table = w["embed_tokens.weight"] if self.deepspec else self.target.get_input_embeddings().weight
        x = table[torch.tensor([prompt[-1]] + [self.mask] * (block_size - 1))]
        q_pos = torch.arange(n - 1, n - 1 + block_size)
        k_pos = torch.cat([torch.arange(n - 1), q_pos])
        theta = c.get("rope_theta") or c["rope_parameters"]["rope_theta"]
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"], eps)
            q = rms(heads(h @ w[p + "self_attn.q_proj.weight"].T, heads_), w[p + "self_attn.q_norm.weight"], eps)
            both = torch.cat([ctx, h])
            k = rms(heads(both @ w[p + "self_attn.k_proj.weight"].T, kv), w[p + "self_attn.k_norm.weight"], eps)
            v = heads(both @ w[p + "self_attn.v_proj.weight"].T, kv)
            visible = torch.ones(block_size, len(k_pos), dtype=torch.bool)
            if self.window and c["layer_types"][i] == "sliding_attention":
                visible = q_pos[:, None] - k_pos[None, :] < self.window
            out = attention(rope(q, q_pos, theta), rope(k, k_pos, theta), v, visible)
            x = x + out @ w[p + "self_attn.o_proj.weight"].T
            x = x + swiglu(rms(x, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
        return rms(x, w["norm.weight"], eps)

    @torch.inference_mode()
    def dflash_drafts(self, prompt: list[int], block_size: int) -> list[int]:
        """z-lab: slots 1..B-1 through the target's LM head; DeepSpec's DFlash: every slot through its own."""
        hidden = self.hidden(prompt, block_size)
        if self.deepspec:
            return (hidden @ self.w["lm_head.weight"].T).argmax(-1).tolist()
        return self.target.get_output_embeddings()(hidden[1:]).argmax(-1).tolist()

    @torch.inference_mode()
    def dspark_drafts(self, prompt: list[int], block_size: int, threshold: float, rule: str = "token") -> list[int]:
        """Greedy DSpark: the Markov head slot by slot, cut before the first slot whose confidence (rule
        token: its own; cumulative: the product up to it) is below `threshold`."""
        c, w = self.config, self.w
        hidden = self.hidden(prompt, block_size)
        base = hidden @ w["lm_head.weight"].T
        r, kind = c["markov_rank"], c.get("markov_head_type")
        prev, state, tokens, alive = prompt[-1], torch.zeros(r), [], 1.0
        for k in range(block_size):
            m = w["markov_head.markov_w1.weight"][prev]
            if kind == "gated":
                gate = torch.sigmoid(torch.cat([hidden[k], m]) @ w["markov_head.gate_proj.weight"].T
                                     + w["markov_head.gate_proj.bias"])
                bias = (gate * m) @ w["markov_head.markov_w2.weight"].T
            elif kind == "rnn":
                z = torch.cat([state, m, hidden[k]]) @ w["markov_head.joint_proj.weight"].T + \
                    w["markov_head.joint_proj.bias"]
                gate, candidate, output = z[:r].sigmoid(), z[r:2 * r].tanh(), z[2 * r:].tanh()
                state = gate * state + (1 - gate) * candidate
                bias = output @ w["markov_head.markov_w2.weight"].T
            else:
                bias = m @ w["markov_head.markov_w2.weight"].T
            if c["enable_confidence_head"]:
                features = torch.cat([hidden[k], m]) if c["confidence_head_with_markov"] else hidden[k]
                confidence = float(torch.sigmoid(features @ w["confidence_head.proj.weight"][0]
                                                 + w["confidence_head.proj.bias"][0]))
                alive = alive * confidence if rule == "cumulative" else confidence
                if alive < threshold:
                    break
            prev = int((base[k] + bias).argmax())
            tokens.append(prev)
        return tokens


# ---------------------------------------------------------------------------------------------------
# MTP modules inside the target's checkpoint (DeepSeek-V3, Qwen3-Next, MiMo)

def deepseek_v3(layers: int, seed: int = 0, vocab: int = 97):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=512, initializer_range=0.3,
        tie_word_embeddings=False, attn_implementation="sdpa")
    return DeepseekV3ForCausalLM(config).eval()


def qwen3_next(layers: int, seed: int = 0, vocab: int = 97):
    """Qwen3-Next's classes with full-attention layers only (the engine cannot cut linear-attention state)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, num_experts=4, num_experts_per_tok=2, layer_types=["full_attention"] * layers,
        max_position_embeddings=512, initializer_range=0.3, tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen3NextForCausalLM(config).eval()


def qwen2(layers: int, seed: int = 0, vocab: int = 97):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).eval()


MTP_FAMILIES = {"deepseek-v3": deepseek_v3, "qwen3-next": qwen3_next, "mimo": qwen2}


@dataclass
class MtpReference:
    """The MTP module of a target written by mtp_target, evaluated directly."""

    family: str
    full: torch.nn.Module  # the model with one layer more: its last layer is the module's block
    weights: dict[str, torch.Tensor]  # the module's norms (as multipliers) and projection

    @torch.inference_mode()
    def first_level(self, target, prompt: list[int], width: int) -> list[int]:
        """The top `width` tokens the module predicts after `prompt`: h = the target's final normed state at
        n - 2, the embedding of token n - 1, through the norms, the projection, the block (causal over rows
        0..n-2) and the post norm, then the target's LM head."""
        eps, w = self.full.config.rms_norm_eps, self.weights
        hidden = target_states(target, prompt)[-1][0]
        embeds = target.get_input_embeddings().weight[torch.tensor(prompt[1:])]
        e, h = rms(embeds, w["enorm"], eps), rms(hidden, w["hnorm"], eps)
        x = (torch.cat([h, e] if self.family == "mimo" else [e, h], -1) @ w["proj"].T)[None]
        rows = torch.arange(len(prompt) - 1)[None]
        causal = torch.ones(rows.shape[1], rows.shape[1], dtype=torch.bool).tril()
        mask = torch.zeros(1, 1, *causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
        out = self.full.model.layers[-1](x, attention_mask=mask, position_ids=rows,
                                         position_embeddings=self.full.model.rotary_emb(x, rows))
        logits = target.get_output_embeddings()(rms(out[0, -1], w["post"], eps))
        return logits.topk(width).indices.tolist()


def mtp_target(path: Path, family: str, layers: int = 2, seed: int = 0,
               tokenizer_from: Path | None = None) -> MtpReference:
    """A target directory whose checkpoint carries one MTP module in the family's published layout.

    A model with one layer more is built and saved as transformers saves it (experts one by one, as
    published); its last decoder layer becomes the MTP block, renamed into the family's layout, beside
    the module's own weights.
    """
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from) if tokenizer_from is not None else None
    full = MTP_FAMILIES[family](layers + 1, seed, len(tokenizer) if tokenizer is not None else 97)
    full.save_pretrained(path)
    state = load_file(str(path / "model.safetensors"))
    h, gen = full.config.hidden_size, torch.Generator().manual_seed(seed + 1)
    block = f"model.layers.{layers}."
    extra = {"enorm": norm_weight(h, gen), "hnorm": norm_weight(h, gen), "proj": linear(h, 2 * h, gen, 2.0),
             "post": norm_weight(h, gen)}
    config = json.loads((path / "config.json").read_text())
    config["num_hidden_layers"] = layers
    if family == "deepseek-v3":
        state.update({block + "enorm.weight": extra["enorm"], block + "hnorm.weight": extra["hnorm"],
                      block + "eh_proj.weight": extra["proj"], block + "shared_head.norm.weight": extra["post"],
                      block + "shared_head.head.weight": state["lm_head.weight"].clone(),
                      block + "embed_tokens.weight": state["model.embed_tokens.weight"].clone()})
        config["num_nextn_predict_layers"] = 1
    else:
        prefix = "mtp.layers.0." if family == "qwen3-next" else "model.mtp_layers.0."
        state = {(prefix + k[len(block):] if k.startswith(block) else k): v for k, v in state.items()}
        if family == "qwen3-next":
            state.update({"mtp.pre_fc_norm_embedding.weight": extra["enorm"] - 1,  # Qwen3-Next norms scale by 1 + w
                          "mtp.pre_fc_norm_hidden.weight": extra["hnorm"] - 1, "mtp.fc.weight": extra["proj"],
                          "mtp.norm.weight": extra["post"] - 1})
            config.update(layer_types=["full_attention"] * layers, mtp_num_hidden_layers=1,
                          mtp_use_dedicated_embeddings=False)
        else:
            state.update({prefix + "token_layernorm.weight": extra["enorm"],
                          prefix + "hidden_layernorm.weight": extra["hnorm"],
                          prefix + "input_proj.weight": extra["proj"],
                          prefix + "final_layernorm.weight": extra["post"]})
            config.update(layer_types=["full_attention"] * layers, num_nextn_predict_layers=1)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return MtpReference(family, full, extra)
