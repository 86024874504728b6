"""The published checkpoints `dflash` reads: z-lab's DFlash and DeepSpec's DFlash, published/block.py."""

from __future__ import annotations

from specbench.methods.published.checkpoint import Checkpoint
from specbench.methods.published.formats import Format, deepspec_architecture, deepspec_block


def is_zlab(checkpoint: Checkpoint) -> bool:
    config = checkpoint.config
    return not deepspec_block(config) and deepspec_architecture(config) is None and \
        ("dflash_config" in config or "DFlashDraftModel" in (config.get("architectures") or []))


def is_deepspec_dflash(checkpoint: Checkpoint) -> bool:
    return deepspec_block(checkpoint.config) and int(checkpoint.config.get("markov_rank", 0)) == 0


FORMATS = (Format("dflash", "a DFlash drafter (z-lab/dflash)", detect=is_zlab, code="block", vllm_as_is=True,
                  vllm_writer="to_vllm.write_dflash"),
           Format("deepspec-dflash", "a DFlash drafter in DeepSpec's layout (deepseek-ai/DeepSpec)",
                  detect=is_deepspec_dflash, code="block", vllm_as_is=True))
