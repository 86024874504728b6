"""The published checkpoints `eagle` reads: EAGLE-3 drafters (SafeAILab/EAGLE, SpecForge), published/eagle3.py."""

from __future__ import annotations

from specbench.methods.published.checkpoint import Checkpoint
from specbench.methods.published.formats import Format, deepspec_architecture, deepspec_block


def is_eagle3(checkpoint: Checkpoint) -> bool:
    config = checkpoint.config
    return deepspec_architecture(config) is None and not deepspec_block(config) and (
        "draft_vocab_size" in config or any(n.startswith("midlayer.") for n in checkpoint.weight_names()))


def older_eagle(checkpoint: Checkpoint) -> str | None:
    names = checkpoint.weight_names()
    if deepspec_architecture(checkpoint.config) is None and "fc.weight" in names \
            and any(n.startswith("layers.0.") for n in names):
        return ("an EAGLE-1/EAGLE-2 checkpoint (fc over [embedding, feature], layers.N); only EAGLE-3 checkpoints "
                "are supported")
    return None


EAGLE3 = Format("eagle3", "an EAGLE-3 drafter (SafeAILab/EAGLE, SpecForge)", detect=is_eagle3,
                lookalike=older_eagle, code="eagle3", vllm_as_is=True,
                vllm_writer="to_vllm.write_eagle3")
FORMATS = (EAGLE3,)
