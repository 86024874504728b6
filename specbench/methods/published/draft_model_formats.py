"""The published checkpoints `draft` reads: any causal language model, as it is."""

from __future__ import annotations

from specbench.methods.published.formats import Format

DRAFT_LM = Format("draft-lm", "a causal language model (a draft model)",
                  detect=lambda checkpoint: "model_type" in checkpoint.config, last_resort=True, vllm_as_is=True)
FORMATS = (DRAFT_LM,)
