"""The published checkpoints `dspark` reads: DeepSpec's DSpark drafters, published/block.py."""

from __future__ import annotations

from specbench.methods.published.checkpoint import Checkpoint
from specbench.methods.published.formats import Format, deepspec_architecture, deepspec_block


def is_deepspec_dspark(checkpoint: Checkpoint) -> bool:
    return deepspec_block(checkpoint.config) and int(checkpoint.config.get("markov_rank", 0)) > 0


def other_deepspec(checkpoint: Checkpoint) -> str | None:
    found = deepspec_architecture(checkpoint.config)
    if found is None:
        return None
    return (f"DeepSpec's {found} checkpoints are not supported (DeepSpec's Qwen3 DFlash and DSpark checkpoints "
            "are, and EAGLE-3 in SafeAILab's layout)")


FORMATS = (Format("deepspec-dspark", "a DSpark drafter (deepseek-ai/DeepSpec)", detect=is_deepspec_dspark,
                  lookalike=other_deepspec, code="block", vllm_as_is=True,
                  vllm_writer="to_vllm.write_dspark"),)
