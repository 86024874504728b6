"""DFlash checkpoints as z-lab ships them (dflash/model.py) and DeepSpec's DFlash and DSpark ones
(deepspec/modeling/dspark/), run by the drafters of methods/dflash.py and methods/dspark.py.

Both are the network of methods/dflash.py: Qwen3 layers whose keys/values read
hidden_norm(fc(target context features)) before the block's own, q/k norms, attention non-causal
within the block, a final norm. What the published checkpoints add is carried here:
- the mask slots embed `mask_token_id` with the embedding table (the target's for z-lab, the
  checkpoint's own `embed_tokens` for DeepSpec), so specbench's mask vector is set to that row, or to
  `mask_embedding.pt` where the checkpoint has one (vLLM's separate mask vector);
- DeepSpec's own `embed_tokens` and `lm_head`;
- RoPE from the config's rope parameters, computed by transformers as the authors' models do;
- z-lab's sliding-window layers (`layer_types`): a query at position p sees the context keys at
  positions above p - sliding_window, and the whole block (as flash-attention and the serving
  engines apply the window; z-lab's transformers code on sdpa passes it on unused);
- the two layouts: z-lab's block [last token, MASK x (B-1)] drafts its slots 1..B-1 (specbench's
  dflash layout); DeepSpec's slot k drafts position n + k, the anchor slot too (the dspark layout);
- DeepSpec's Markov heads (vanilla, gated, rnn) and confidence head (input H, or H + r with the
  Markov embedding of the previous token), one step per draft slot.
`target_layer_ids` name decoder-layer outputs: HF hidden_states[id + 1] (DeepSpec's -1: the embeddings).
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.core.errors import SpecbenchError
from specbench.decoding.linear import Linear
from specbench.methods.dflash import BlockConfig, DFlashDrafter, DFlashModel
from specbench.methods.dspark import DSparkDrafter
from specbench.methods.layers import Arch
from specbench.methods.published.common import Rotary, check_equal, hf_config, load_into, target_vocab
from specbench.methods.published.formats import DrafterSource

# inside layers.N: the published module names -> specbench's DraftLayer names
LAYER_NAMES = {
    "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "o_proj", "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
    "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "down_proj",
}
TOP_NAMES = {"hidden_norm": "context_norm"}
MASK = "mask_embedding"  # specbench's mask vector: the embedding row of mask_token_id


def _rename(key: str, layer_names: dict[str, str], top_names: dict[str, str]) -> str:
    parts = key.split(".")
    if parts[0] == "layers" and len(parts) > 3:
        module = ".".join(parts[2:-1])
        return ".".join(["layers", parts[1], layer_names.get(module, module), parts[-1]])
    module = ".".join(parts[:-1])
    return ".".join([top_names.get(module, module), parts[-1]]) if module else key


def specbench_name(key: str) -> str:
    """A published weight name as specbench's block drafter calls it."""
    return _rename(key, LAYER_NAMES, TOP_NAMES)


def published_name(key: str) -> str:
    """The inverse of specbench_name."""
    return _rename(key, {v: k for k, v in LAYER_NAMES.items()}, {v: k for k, v in TOP_NAMES.items()})


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default context layers (build_target_layer_ids), used when dflash_config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class PublishedBlockModel(DFlashModel):
    """methods/dflash.py's network with a published checkpoint's embedding, head, RoPE and windows."""

    def __init__(self, target_model: nn.Module, block: BlockConfig, options, config,
                 windows: tuple[int | None, ...], own_vocab: int | None):
        super().__init__(target_model, block, options)
        self.rotary = Rotary(config)
        self.windows = windows
        if own_vocab:
            h = block.arch.hidden_size
            self.embed_tokens = nn.Embedding(own_vocab, h)
            self.lm_head = Linear(h, own_vocab, bias=False)

    def token_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids) if hasattr(self, "embed_tokens") else super().token_embeddings(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) if hasattr(self, "lm_head") else super().logits(hidden)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions, self.fc.weight.dtype)

    def layer_masks(self, positions: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]],
                    mask: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Sliding-window layers when drafting (the block follows the context it sees, contiguously)."""
        if mask is not None or not any(self.windows):
            return super().layer_masks(positions, context, mask)
        seen = context[0][0].shape[-2]
        keys = torch.cat([positions[..., :1] - seen + torch.arange(seen, device=positions.device), positions], -1)
        distance = positions[..., :, None] - keys[..., None, :]
        return [None if window is None else (distance < window).unsqueeze(-3) for window in self.windows]


class VanillaMarkov(nn.Module):
    """logits_k += W2(W1[previous token])."""

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = Linear(rank, vocab, bias=False)

    def step(self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None):
        """(logit bias, state for the next slot, W1[prev])."""
        memory = self.markov_w1(prev)
        return self.markov_w2(memory), state, memory


class GatedMarkov(VanillaMarkov):
    """The bias of W1[prev] gated by sigmoid(gate_proj([hidden, W1[prev]]))."""

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.gate_proj = Linear(hidden + rank, rank)

    def step(self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None):
        memory = self.markov_w1(prev)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, memory], -1)))
        return self.markov_w2(gate * memory), state, memory


class RnnMarkov(VanillaMarkov):
    """A GRU-like state s over the block: [s, W1[prev], hidden] -> gate, candidate, output."""

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.joint_proj = Linear(2 * rank + hidden, 3 * rank)

    def step(self, hidden: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None):
        memory = self.markov_w1(prev)
        state = torch.zeros_like(memory) if state is None else state
        gate, candidate, output = self.joint_proj(torch.cat([state, memory, hidden], -1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state, memory


MARKOV_HEADS = {"vanilla": VanillaMarkov, "gated": GatedMarkov, "rnn": RnnMarkov}


def markov_type(config) -> str:
    kind = str(getattr(config, "markov_head_type", "vanilla")).lower()
    if kind not in MARKOV_HEADS:
        raise SpecbenchError(f"drafter markov_head_type {kind!r} is not one of {', '.join(MARKOV_HEADS)}")
    return kind


class ConfidenceHead(nn.Module):
    def __init__(self, inputs: int):
        super().__init__()
        self.proj = Linear(inputs, 1)


class PublishedDSparkModel(PublishedBlockModel):
    """DeepSpec's Qwen3DSparkModel: the block network plus its Markov and confidence heads."""

    def __init__(self, target_model: nn.Module, block: BlockConfig, options, config,
                 windows: tuple[int | None, ...], own_vocab: int | None):
        super().__init__(target_model, block, options, config, windows, own_vocab)
        h, rank = block.arch.hidden_size, int(config.markov_rank)
        self.markov_head = MARKOV_HEADS[markov_type(config)](config.vocab_size, rank, h)
        self.with_markov = bool(getattr(config, "confidence_head_with_markov", False))
        enabled = bool(getattr(config, "enable_confidence_head", False))
        self.confidence_head = ConfidenceHead(h + rank if self.with_markov else h) if enabled else None

    def step_heads(self, hidden: torch.Tensor, logits: torch.Tensor, prev: torch.Tensor,
                   state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        bias, state, memory = self.markov_head.step(hidden, prev, state)
        confidence = None
        if self.confidence_head is not None:
            features = torch.cat([hidden, memory], -1) if self.with_markov else hidden
            confidence = self.confidence_head.proj(features)[..., 0]
        return logits + bias, confidence, state


def block_size(config: dict) -> int | None:
    """z-lab's older configs keep block_size at the top level, newer ones in dflash_config."""
    return config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")


def knob_defaults(source: DrafterSource) -> dict:
    """The published checkpoint's own settings, under the user's --set values: its block size, the whole
    context (neither z-lab nor DeepSpec windows the draft context) and DeepSpec's confidence rule."""
    defaults = {"context_window": 0}
    if block_size(source.checkpoint.config):
        defaults["block_size"] = int(block_size(source.checkpoint.config))
    if source.format == "deepspec-dspark":
        defaults["confidence_rule"] = "token"
    return defaults


def layer_windows(config, raw: dict, layers: int, name: str) -> tuple[int | None, ...]:
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * layers)[:layers]
    window = (raw.get("dflash_config") or {}).get("sliding_window") or getattr(config, "sliding_window", None)
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise SpecbenchError(f"drafter {name}: layer types {', '.join(unknown)} are not supported")
    if "sliding_attention" in types and not window:
        raise SpecbenchError(f"drafter {name}: sliding_attention layers but no sliding_window in config.json")
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def check_architecture(config, name: str) -> None:
    if getattr(config, "attention_bias", False):
        raise SpecbenchError(f"drafter {name}: attention_bias is true; only bias-free Qwen3 layers are supported")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise SpecbenchError(f"drafter {name}: hidden_act {config.hidden_act} is not supported (silu is)")


def layout(source: DrafterSource, num_target_layers: int) -> tuple[list[int], int, bool]:
    """target_layer_ids, mask_token_id and whether the anchor slot drafts (DeepSpec's layout)."""
    raw = source.checkpoint.config
    if source.format == "dflash":
        dflash = raw.get("dflash_config") or {}
        if "mask_token_id" not in dflash:
            raise SpecbenchError(f"drafter {source.checkpoint.name}: dflash_config.mask_token_id is missing")
        ids = dflash.get("target_layer_ids") or zlab_target_layer_ids(num_target_layers, raw["num_hidden_layers"])
        return list(ids), int(dflash["mask_token_id"]), False
    for key in ("target_layer_ids", "mask_token_id"):
        if key not in raw:
            raise SpecbenchError(f"drafter {source.checkpoint.name}: config.json has no {key}")
    return list(raw["target_layer_ids"]), int(raw["mask_token_id"]), True


def mask_embedding(source: DrafterSource, mask_id: int) -> torch.Tensor | None:
    """vLLM's separate mask vector, `mask_embedding.pt` beside the weights (a tensor, or a dict of it and
    its mask_token_id), used in place of the embedding row of mask_token_id; None without one."""
    path = source.path / "mask_embedding.pt"
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        raise SpecbenchError(f"drafter {source.checkpoint.name}: mask_embedding.pt is not readable ({exc})") from None
    if isinstance(saved, dict):
        if saved.get("mask_token_id", mask_id) != mask_id:
            raise SpecbenchError(f"drafter {source.checkpoint.name}: mask_embedding.pt is for mask_token_id "
                                 f"{saved['mask_token_id']}, its config says {mask_id}")
        saved = saved.get("embedding")
    if not isinstance(saved, torch.Tensor):
        raise SpecbenchError(f"drafter {source.checkpoint.name}: mask_embedding.pt holds no tensor")
    return saved.reshape(-1).float()


def load(source: DrafterSource, target, options) -> DFlashDrafter:
    """A DFlash (z-lab or DeepSpec) or DSpark (DeepSpec) drafter for `target`, checked against it."""
    name, raw = source.checkpoint.name, source.checkpoint.config
    config = hf_config(raw, name)
    check_architecture(config, name)
    t = target.model.config
    vocab = target_vocab(target.model)
    deepspec = source.format.startswith("deepspec")
    if deepspec:
        check_equal(name, "target family (model_type)", config.model_type, t.model_type)
    check_equal(name, "hidden size", config.hidden_size, t.hidden_size)
    check_equal(name, "vocabulary size", config.vocab_size, vocab)
    if getattr(config, "num_target_layers", None) is not None:
        check_equal(name, "target layer count (num_target_layers)", config.num_target_layers, t.num_hidden_layers)
    ids, mask_id, shifted = layout(source, t.num_hidden_layers)
    lowest = -1 if deepspec else 0
    if not ids or min(ids) < lowest or max(ids) > t.num_hidden_layers - 2:
        raise SpecbenchError(f"drafter {name}: target_layer_ids {ids} must lie in {lowest}..{t.num_hidden_layers - 2} "
                             f"for a {t.num_hidden_layers}-layer target (the last layer's HF state is normed)")
    if not 0 <= mask_id < vocab:
        raise SpecbenchError(f"drafter {name}: mask_token_id {mask_id} is outside the vocabulary of {vocab}")
    layers = config.num_hidden_layers
    block = BlockConfig(Arch.of(config), vocab, layers, tuple(i + 1 for i in ids), shifted)
    model_cls = PublishedDSparkModel if source.format == "deepspec-dspark" else PublishedBlockModel
    model = model_cls(target.model, block, options, config, layer_windows(config, raw, layers, name),
                      config.vocab_size if deepspec else None)
    state = {specbench_name(k): v for k, v in source.checkpoint.load(source.checkpoint.weight_names()).items()}
    table = state.get("embed_tokens.weight")
    if table is None:  # the target's: only its mask row is needed, so it is not copied whole
        table = target.model.get_input_embeddings().weight.detach()
    if table.shape[0] <= mask_id:
        raise SpecbenchError(f"drafter {name}: its embedding has {table.shape[0]} rows, no row for "
                             f"mask_token_id {mask_id}")
    state[MASK] = mask_embedding(source, mask_id)
    if state[MASK] is None:
        state[MASK] = table[mask_id].float().cpu()
    load_into(model, state, name, published_name)
    drafter_cls = DSparkDrafter if source.format == "deepspec-dspark" else DFlashDrafter
    return drafter_cls(model.to(target.device, target.model.dtype).eval(), options)
