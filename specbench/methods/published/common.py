"""What the published-format readers share: the drafter's HF config, its RoPE, strict weight loading,
and one-line checks against the target."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specbench.core.errors import SpecbenchError

CosSin = tuple[torch.Tensor, torch.Tensor]


def hf_config(config: dict, name: str) -> PretrainedConfig:
    """The checkpoint's config.json as its transformers config class (unknown keys kept as attributes)."""
    try:
        return AutoConfig.for_model(**config)
    except (ValueError, TypeError, KeyError) as exc:
        raise SpecbenchError(f"drafter {name}: config.json is not a transformers config ({exc})") from None


class Rotary(nn.Module):
    """cos/sin for any positions, computed by transformers from the config's rope parameters (default,
    linear, llama3, yarn, ...), exactly as the authors' models compute them."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> CosSin:
        """positions (..., n) -> cos, sin of shape (..., 1, n, head_dim), to broadcast over heads."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = self.rotary(probe, positions.reshape(1, -1))
        shape = (*positions.shape, cos.shape[-1])
        return cos.view(shape).unsqueeze(-3), sin.view(shape).unsqueeze(-3)


def load_into(module: nn.Module, state: dict[str, torch.Tensor], name: str,
              published: Callable[[str], str] = lambda key: key) -> None:
    """Load `state` (the module's own names) strictly: a missing, unexpected or misshapen weight is one
    line naming the weight as the checkpoint calls it (`published` maps a module name back)."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise SpecbenchError(f"drafter {name}: weight {published(missing[0])} is missing{more}")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise SpecbenchError(f"drafter {name}: unexpected weight {published(unexpected[0])} for this format")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise SpecbenchError(f"drafter {name}: weight {published(key)} has shape {tuple(tensor.shape)}, "
                                 f"its config implies {tuple(expected[key].shape)}")
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def check_equal(name: str, what: str, drafter_value, target_value) -> None:
    if drafter_value != target_value:
        raise SpecbenchError(f"drafter {name} does not fit this target: its {what} is {drafter_value}, "
                             f"the target's is {target_value}")


def target_vocab(target_model: nn.Module) -> int:
    return target_model.get_output_embeddings().weight.shape[0]
