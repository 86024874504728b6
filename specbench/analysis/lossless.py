"""The lossless check: where a greedy output first leaves `ar`'s, and how close the target's call was there.

A float32 mismatch is a bug. In bfloat16 or float16 a verify forward over several tokens rounds
differently from a one-token forward, so two near-tied logits can swap; the margin between `ar`'s
token and the strategy's token at the first divergence tells the two apart (a margin near 0 is a
rounding tie, a large one is a real error).
"""

from __future__ import annotations

import pandas as pd


def first_divergence(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where `tokens` differs from `reference` (or where the shorter one ends); None if equal."""
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def divergence_margin(model, prompt: list[int], tokens: list[int], reference: list[int], position: int) -> float | None:
    """logit(ar's token) - logit(the strategy's token) at `position`, from one plain forward over the prompt
    and `ar`'s first `position` tokens; None when either output simply ended there."""
    import torch  # here: reading runs' divergences (stats, recommend) needs no torch

    if position >= min(len(tokens), len(reference)):
        return None
    ids = torch.tensor([prompt + reference[:position]], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, -1].float()
    return float(logits[reference[position]] - logits[tokens[position]])


def divergences(rows: pd.DataFrame) -> tuple[list[int], list[float]]:
    """The first divergences and logit margins recorded in a run's rows (runs written before margins
    were recorded have none)."""
    margins = rows["divergence_margin"].dropna() if "divergence_margin" in rows else []
    return [int(v) for v in rows["first_divergence"].dropna()], [float(v) for v in margins]


def mismatch_detail(first_divergences: list[int], margins: list[float]) -> str:
    """Where greedy outputs first left `ar`'s and the logit margins there, as a clause to append."""
    text = f"; earliest divergence at token {min(first_divergences)}" if first_divergences else ""
    if margins:
        low, high = min(margins), max(margins)
        span = f"{low:.3g}" if low == high else f"{low:.3g} to {high:.3g}"
        text += f"; logit margin there {span} (near 0: low-precision ties; large: a bug)"
    return text
