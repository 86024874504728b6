"""The range of every numeric command-line option, in one table, and the choices of --dtype and --device,
checked before torch is imported.

An option means the same thing in every command that takes it (`--temperature` of run, tune and
recommend), so the table is keyed by the flag. A config file's value is checked under the flag
that sets it. Checks that depend on something loaded (a context length against the model's) are
made where that is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specbench.core.errors import SpecbenchError


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # the bound itself is outside
    open_high: bool = False
    note: str = ""  # what the bound means, shown after the range

    def holds(self, value: float) -> bool:
        if isinstance(value, bool) or not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
        elif self.low is not None:
            text = f"above {self.low:g}" if self.open_low else f"at least {self.low:g}"
        else:
            text = f"below {self.high:g}" if self.open_high else f"at most {self.high:g}"
        return text + (f" ({self.note})" if self.note else "")


DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device(device: str) -> None:
    if device not in DEVICE_CHOICES:
        raise SpecbenchError(f"--device {device}: expected {', '.join(DEVICE_CHOICES)}")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_CHOICES:
        raise SpecbenchError(f"--dtype {dtype}: expected {', '.join(DTYPE_CHOICES)}")


def _at_least(low: int, note: str = "") -> Range:
    return Range(low, note=note)


RANGES: dict[str, Range] = {
    # the workload: run, tune, recommend, train
    "--limit": _at_least(0, "0: every prompt"),
    "--max-new-tokens": _at_least(1),
    "--temperature": _at_least(0, "0: greedy"),
    "--top-p": Range(0, 1, open_low=True, note="1: off"),
    "--top-k": _at_least(0, "0: off"),
    "--seed": _at_least(0),
    "--warmup": _at_least(0),
    "--warmup-cap": _at_least(1, "passes of an engine that compiles"),
    "--outlier-k": Range(1, 100, note="scaled MADs above the median"),
    "--repeats": _at_least(1),
    "--batch-size": _at_least(1),
    # tune
    "--trials": _at_least(1),
    "--timeout": Range(0, open_low=True, note="seconds"),
    "--workers": _at_least(1),
    "--holdout": Range(0, 1, open_low=True, open_high=True, note="the fraction of prompts held out"),
    "--heartbeat": _at_least(1, "seconds"),
    # recommend
    "--context-len": _at_least(1, "tokens"),
    "--vram-used": _at_least(0, "GB"),
    "--pcie": Range(3, 6, note="a PCIe generation"),
    "--bw-util": Range(0, 1, open_low=True, note="a fraction: 0.8 for 80%"),
    "--score-variance": _at_least(0),
    # train
    "--steps": _at_least(1),
    "--lr": Range(0, open_low=True),
    "--synthesise": _at_least(0, "0: off"),
    # prepare
    "--prompts": _at_least(1),
    "--passage-tasks": _at_least(0),
    "--answer-tokens": _at_least(1),
    "--conversations": _at_least(0, "0: none"),
    "--conversation-tokens": _at_least(1),
    "--patience": _at_least(0, "0: never"),
    "--draft-vocab": _at_least(1, "tokens"),
    # convert
    "--mask-token-id": _at_least(0, "a vocabulary row"),
    # serve
    "--concurrency": _at_least(1, "requests served at once"),
    "--request-rate": Range(0, open_low=True, note="requests per second"),
    "--max-concurrency": _at_least(1),
    "--burstiness": Range(0, open_low=True, note="1: Poisson arrivals"),
    "--requests": _at_least(1, "per level"),
    "--level-seconds": Range(0, open_low=True, note="seconds"),
    "--request-timeout": Range(0, open_low=True, note="seconds"),
    "--input-len": _at_least(1, "tokens"),
    "--output-len": _at_least(1, "tokens"),
    "--range-ratio": Range(0, 1, open_high=True, note="lengths drawn within (1 +- ratio) x --input-len, --output-len"),
    "--prefix-len": _at_least(1, "tokens every synthetic prompt shares"),
    "--slo-share": Range(0, 1, open_low=True, open_high=True, note="a share of requests: 0.99 for 99%"),
}


def check_range(option: str, value: Any) -> None:
    """Refuse `value` of `option` (a flag of RANGES) outside its range; None means not given."""
    if value is not None and not RANGES[option].holds(value):
        raise SpecbenchError(f"{option} must be {RANGES[option].describe()}, got {value}")


def check_ranges(values: dict[str, Any]) -> None:
    """check_range for every flag -> value of `values`."""
    for option, value in values.items():
        check_range(option, value)


def check_sizes(values: tuple[int, ...] | list[int], option: str, low: int = 1) -> None:
    """A list of sizes must name at least one, each at least `low`, in increasing order without repeats."""
    if not values:
        raise SpecbenchError(f"{option} names no size; give a comma list such as 1,4,16")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < low for v in values):
        raise SpecbenchError(f"{option} {','.join(map(str, values))}: every size must be an integer of at least {low}")
    if list(values) != sorted(set(values)):
        raise SpecbenchError(f"{option} {','.join(map(str, values))}: list the sizes in increasing order, "
                             "each once")
