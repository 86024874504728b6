"""The engine names the records carry: specbench's own engine, the reference every run has, and a strategy
named with its engine."""

from __future__ import annotations

SPECBENCH = "specbench"  # the reference engine: its `ar` runs in every run; agreement and transfer read against it


def label(strategy: str, engine: str) -> str:
    """A strategy named with its engine where that is not specbench's own: `ngram`, `ngram@vllm`."""
    return strategy if engine == SPECBENCH else f"{strategy}@{engine}"
