"""What `specbench run` says beside its tables, as styled lines: the start-up and the estimate from the
warm-up, how long each engine took to start, what the run noted, where a strategy stops paying on the
projected GPU, and the lossless checks (each strategy's greedy outputs against `ar`'s, each engine's `ar`
against the reference engine's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.analysis.lossless import mismatch_detail
from specbench.core.engine_names import SPECBENCH
from specbench.core.records import RunResult
from specbench.methods.names import BASELINE
from specbench.plan.run_config import RunConfig


@dataclass(frozen=True)
class Line:
    text: str
    style: str | None = None  # rich's: a failed check is bold red


def compiling(seconds: float | None) -> str:
    """What part of an engine's start-up was compiling (vLLM reports it)."""
    if seconds is None:
        return "compiled; vLLM times its compilation on a GPU only"
    return f"compiling {seconds:.0f} s" if seconds else "eager: nothing compiled"


def estimate_lines(figures: dict[str, Any]) -> list[Line]:
    """After the warm-up: how long the start-up took and the measuring should take, and what makes it noisy."""
    lines = [Line(f"started in {figures['startup_s']:.1f} s (models loaded, warm-up; nothing is compiled); "
                  f"measuring {figures['prompts']} prompts x {figures['strategies']} strategies (ar included): "
                  f"about {figures['seconds']:.0f} s, estimated from the warm-up")]
    if figures["skipped"]:
        lines.append(Line(f"warning: {len(figures['skipped'])} prompt(s) skipped: with the answer they would not "
                          f"fit the model's context of {figures['context']} tokens", "yellow"))
    if figures["busy"]:
        lines.append(Line(f"warning: the machine is busy before the run (load {figures['load']:.1f} on "
                          f"{figures['cpus']} CPUs): timings will be noisy", "yellow"))
    return lines


def start_and_notes(result: RunResult) -> list[Line]:
    """Each engine's start-up per strategy, then the run's notes: what comes before the results."""
    lines = []
    for report in result.engines:
        for name, seconds in report.start_s.items():
            compiled = (f" ({compiling(report.details['compile_s'].get(name))})"
                        if "compile_s" in report.details else "")
            lines.append(Line(f"{report.engine} engine for {name} started in {seconds:.0f} s{compiled}"))
    return lines + [Line(f"note: {note}") for note in result.notes]


def stops_paying(result: RunResult, config: RunConfig) -> list[Line]:
    """Where each strategy stops paying on the projected GPU, and the load axis's note where it has no model."""
    lines = []
    for r in result.summary:
        stops = r.projection.by_batch if r.projection else None
        if stops and r.strategy != BASELINE:
            where = (f"stops paying at batch size {stops['stops_paying_at']}" if stops["stops_paying_at"]
                     else f"still pays at batch size {stops['points'][-1]['batch_size']}")
            lines.append(Line(f"projected on {stops['gpu']}: {r.strategy} {where}"))
    if result.load and not result.load.modelled and config.batch_sizes != [1]:
        lines.append(Line(f"note: {result.load.note}"))
    return lines


def lossless_checks(result: RunResult, config: RunConfig) -> list[Line]:
    """Greedy runs only: each strategy whose outputs left `ar`'s, and how far each engine's `ar` agrees with
    the reference engine's."""
    if config.temperature != 0:
        return []
    lines = []
    for r in result.summary:
        if r.mismatches:
            at = f" at batch size {r.batch_size}" if r.batch_size > 1 else ""
            where = "" if r.engine == SPECBENCH else f" in {r.engine}"
            lines.append(Line(f"LOSSLESS CHECK FAILED: {r.strategy}{where}{at}: {r.mismatches} of {r.prompts} "
                              f"greedy outputs differ from ar{where}"
                              + mismatch_detail(r.first_divergence, r.divergence_margin), "bold red"))
    margins = {r.engine: r.engine_agreement.divergence_margin for r in result.summary if r.engine_agreement}
    for pair in result.engine_pairs:
        if pair.prompts:  # specbench's forward gives the margins where specbench is one of the two
            margin = margins.get(pair.engine, []) if pair.reference == SPECBENCH else []
            lines.append(Line(f"engines: {pair.engine}'s ar and {pair.reference}'s agree on {pair.agreeing} of "
                              f"{pair.prompts} greedy outputs"
                              + (mismatch_detail(pair.first_divergence, margin) if pair.first_divergence else "")))
    return lines
