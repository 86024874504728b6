"""The published checkpoints `mtp` reads: MTP modules inside the target's own checkpoint, published/mtp.py.

They are never a --drafter: the target carries them (published/mtp.py's builtin_source finds them).
"""

from __future__ import annotations

from specbench.methods.published.formats import Format

FORMATS = tuple(Format(name, description, code="deepseek_mtp", builtin=True) for name, description in (
    ("mtp-deepseek-v3", "the target's own MTP modules, DeepSeek-V3 layout (model.layers.L+k)"),
    ("mtp-qwen3-next", "the target's own MTP module, Qwen3-Next layout (mtp.*)"),
    ("mtp-mimo", "the target's own MTP modules, MiMo layout (model.mtp_layers.*)"),
))
