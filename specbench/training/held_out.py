"""Whether a drafter learns, before any benchmark runs: its acceptance on prompts it never trained on.

The drafter is loaded from its directory the way `run` loads it and drafts through the real decode
loop (greedy, its method's default controller), so a figure here is the benchmark's tau and
per-position acceptance on held-out prompts, without the timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specbench.decoding.decode import generate
from specbench.methods.build import controller_factory
from specbench.methods.registry import definition
from specbench.training.reporter import Reporter


@dataclass(frozen=True)
class HeldOut:
    tau: float  # tokens per target forward, the bonus token included
    acceptance: tuple[float, ...]  # [k]: share of drafting steps that accepted more than k drafts

    def line(self) -> str:
        shown = " ".join(f"{a:.2f}" for a in self.acceptance[:6])
        return f"held-out tau {self.tau:.2f}, acceptance by position {shown}"


def held_out(target, strategy: str, options: Any, drafter_dir: Path, prompts: list[list[int]],
             max_new_tokens: int) -> HeldOut:
    """The `strategy` drafter in `drafter_dir` decoding `prompts` greedily, `max_new_tokens` each."""
    drafter = definition(strategy).build(target, options, drafter_dir)
    controller = controller_factory(strategy, drafter, options)
    tokens = steps = drafts = 0
    accepted: list[int] = []
    for prompt in prompts:
        out = generate(target.model, prompt, max_new_tokens, eos_ids=target.eos_ids, drafter=drafter,
                       controller=controller())
        tokens, steps, drafts = tokens + len(out.tokens), steps + out.steps, drafts + out.drafts
        accepted += [0] * (len(out.accept_by_position) - len(accepted))
        for k, count in enumerate(out.accept_by_position):
            accepted[k] += count
    return HeldOut(tokens / max(steps, 1), tuple(a / max(drafts, 1) for a in accepted))


def evaluator(target, strategy: str, options: Any, prompts: list[list[int]], max_new_tokens: int, report: Reporter,
              record: list[dict], patience: int = 0) -> Callable[[int, Path], bool] | None:
    """The trainer's `evaluate`: the drafter saved at a step decoded on `prompts`, said and kept in `record`
    (None without prompts); it answers False, ending the training, once held-out tau has reached a plateau
    over `patience` evaluations (0: never)."""
    if not prompts:
        return None

    def evaluate(step: int, drafter_dir: Path) -> bool:
        result = held_out(target, strategy, options, drafter_dir, prompts, max_new_tokens)
        record.append({"step": step, "tau": round(result.tau, 3),
                       "acceptance": [round(a, 3) for a in result.acceptance]})
        report.say(f"{strategy} step {step}: {result.line()}")
        return not (patience and plateaued([entry["tau"] for entry in record], patience))

    return evaluate


def plateaued(taus: list[float], patience: int, gain: float = 0.01) -> bool:
    """The last `patience` held-out taus raised the best before them by less than `gain` (1%): training
    longer buys no acceptance, as early stopping on a validation metric reads it."""
    if len(taus) <= patience:
        return False
    return max(taus[-patience:]) < (1 + gain) * max(taus[:-patience])
