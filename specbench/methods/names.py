"""Parsing `--strategy` values: `ar`, one drafter, a combination `a+b[+c]`, `default` or `all`.

Torch-free, so that a bad name is refused before any heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.core.errors import SpecbenchError
from specbench.methods.registry import DRAFTER_NAMES

BASELINE = "ar"

# the combinations `all` includes (their proposals merged into SpecInfer's token tree, arXiv 2305.09781, and
# combined as methods/combine_options.py says); any other combination can be named explicitly. EAGLE with
# suffix decoding or n-gram is the pair the field combines (SuffixDecoding, arXiv 2411.04975)
COMBINATIONS = ("eagle+dflash", "mtp+dspark", "eagle+dspark", "dflash+dspark", "eagle+mtp",
                "eagle+suffix", "ngram+eagle", "dspark+suffix")

# `default`: the fastest method of each family on the embedded model (results/benchmarks/) and the
# combination the product is known by; `all` is the full comparison
DEFAULT_STRATEGIES = ("ngram", "mtp", "dspark", "eagle+dflash")


@dataclass(frozen=True)
class StrategyName:
    """A parsed `--strategy` value: `ar`, one drafter, or a combination in canonical order."""

    members: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(self.members) or BASELINE


def parse_strategy(text: str) -> StrategyName:
    text = text.strip().lower()
    if text == BASELINE:
        return StrategyName(())
    members = [m.strip() for m in text.split("+")]
    for m in members:
        if m == BASELINE:
            raise SpecbenchError(f"strategy {text}: `ar` is the baseline of every run and cannot be combined")
        if m not in DRAFTER_NAMES:
            raise SpecbenchError(f"unknown strategy {m!r}; known: {', '.join((BASELINE,) + DRAFTER_NAMES)}")
    if len(set(members)) != len(members):
        raise SpecbenchError(f"strategy {text}: a combination cannot repeat a member")
    return StrategyName(tuple(sorted(members, key=DRAFTER_NAMES.index)))


def all_strategies() -> list[StrategyName]:
    """Every drafter, then every listed combination."""
    return [StrategyName((name,)) for name in DRAFTER_NAMES] + [parse_strategy(c) for c in COMBINATIONS]


def parse_strategies(values: list[str]) -> list[StrategyName]:
    """Repeatable / comma-separated values; `all` and `default` expand to their sets. `ar` first."""
    specs: list[StrategyName] = [StrategyName(())]
    named = [text.strip().lower() for value in values for text in value.split(",") if text.strip()]
    if not named:
        raise SpecbenchError("--strategy names no strategy; give one such as dspark, eagle+dflash, default or all")
    for text in named:
        if text == "all":
            new = all_strategies()
        elif text == "default":
            new = [parse_strategy(s) for s in DEFAULT_STRATEGIES]
        else:
            new = [parse_strategy(text)]
        specs.extend(s for s in new if s not in specs)
    return specs
