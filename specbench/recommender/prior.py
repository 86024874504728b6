"""The prior: the selection rules of a practitioners' comparison of EAGLE, MTP, DFlash and DSpark (a blog
post: folklore that evidence outranks) and the load rule, as data.

Each rule reads one workload signal and holds ordered branches; the first branch whose test holds
acts. A rule whose signal was not given is skipped. Rules run in the order of `PRIOR`: the load
rule, then the rules that choose a strategy (the first choice sticks; what a later rule would
have chosen becomes an alternative), then the PCIe rule, which modifies the choice. The order of
the choosing rules follows the article; the signals it lists as "further" (bandwidth utilisation,
output-score variance) come after its four numbered rules, and the fallback comes last.

Two readings settle where the article is loose. "Ample memory: skip DFlash" excludes DFlash from
the later rules, so an expert team or a saturated bus choose DFlash only when the memory in use
is unknown. "PCIe 5.0: EAGLE+DSpark" upgrades an EAGLE choice to the pair (a merged trie verified
in one forward); it does not override MTP for high-precision work.

Verbs: choose a strategy, skip (exclude) one, baseline (`ar`, speculation off), cap the draft
length, combine the choice into a pair, avoid a pair everywhere (the evidence included), pass.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from specbench.methods.names import BASELINE
from specbench.methods.registry import definition
from specbench.recommender.workload import (
    CREATIVE_TASKS,
    DEFAULT_VERIFY_TOKENS,
    HIGH_PRECISION_TASKS,
    Workload,
)

Verb = Literal["choose", "skip", "baseline", "cap", "combine", "avoid", "pass"]  # what a branch does
OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq,
    "in": lambda value, options: value in options,
}


@dataclass(frozen=True)
class Test:
    """`signal op value` over a Workload attribute."""

    signal: str
    op: str
    value: Any

    def holds(self, workload: Workload) -> bool:
        return OPS[self.op](getattr(workload, self.signal), self.value)

    def __str__(self) -> str:
        value = ", ".join(self.value) if isinstance(self.value, tuple) else self.value
        return f"{self.signal} {self.op} {value}"


@dataclass(frozen=True)
class Branch:
    test: Test | None  # None: always
    verb: Verb
    strategy: str | None  # the strategy chosen, skipped, combined into or avoided
    reason: str  # str.format fields: the Workload's attributes and properties
    chosen: str | None = None  # combine: the choice the branch upgrades

    def describe(self) -> str:
        action = self.verb if self.strategy is None else f"{self.verb} {self.strategy}"
        action += f" (when {self.chosen} was chosen)" if self.chosen else ""
        return f"{self.test or 'otherwise'} -> {action}"


@dataclass(frozen=True)
class Rule:
    id: str
    signal: str | None  # the workload attribute the rule reads (not given -> skipped); None: always acts
    question: str
    source: str
    branches: tuple[Branch, ...]

    def branch_for(self, workload: Workload) -> Branch | None:
        """The branch that acts on `workload`; None when the rule's signal was not given."""
        if self.signal is not None and getattr(workload, self.signal) is None:
            return None
        return next(b for b in self.branches if b.test is None or b.test.holds(workload))


ARTICLE = "the EAGLE/MTP/DFlash/DSpark practitioners' comparison, selection section"
PRIOR: tuple[Rule, ...] = (
    Rule("load", "batch_size", "Does the batch leave the forward memory-bound?",
         "specbench (roofline, Williams et al. 2009): a forward turns compute-bound at bf16 FLOP/s over bytes/s "
         "tokens", (
             Branch(Test("batch_size", "==", 1), "pass", None,
                    "batch 1: a forward reads every weight for one token, so verifying drafts is nearly free"),
             Branch(Test("verify_budget", "<", 2), "baseline", BASELINE,
                    "batch {batch_size}: a forward turns compute-bound at {ridge_tokens:.0f} tokens on {gpu.name}, "
                    "so each draft costs about as much to verify as to decode: speculation stops paying"),
             Branch(Test("verify_budget", "<", DEFAULT_VERIFY_TOKENS), "cap", None,
                    "batch {batch_size}: the forward stays memory-bound up to {verify_budget} tokens per sequence "
                    "({ridge_tokens:.0f} on {gpu.name}): draft at most {short_k}"),
             Branch(None, "pass", None, "batch {batch_size}: the forward stays memory-bound at the default draft "
                                        "lengths ({verify_budget} tokens per sequence fit)"),
         )),
    Rule("memory", "vram_used_gb", "Is GPU memory under pressure?", f"{ARTICLE}, rule 1", (
        Branch(Test("vram_used_gb", ">", 16), "choose", "dflash",
               "{vram_used_gb:g} GB in use (> 16): DFlash, whose sliding context window bounds its memory"),
        Branch(None, "skip", "dflash",
               "{vram_used_gb:g} GB in use (<= 16): ample memory, skip DFlash, optimise compute"),
    )),
    Rule("error_tolerance", "task", "How much error does the task tolerate?", f"{ARTICLE}, rule 2", (
        Branch(Test("task", "in", HIGH_PRECISION_TASKS), "choose", "mtp", "{task}: high-precision work, MTP"),
        Branch(Test("task", "in", CREATIVE_TASKS), "choose", "eagle", "{task}: creative or chat work, EAGLE"),
        Branch(None, "pass", None, "{task}: neither high-precision nor creative work, the rule says nothing"),
    )),
    Rule("bandwidth", "bw_util", "How busy is the memory bus?", f"{ARTICLE}, further signals", (
        Branch(Test("bw_util", ">", 0.75), "choose", "dflash", "{bw_util:.0%} bandwidth in use (> 75%): DFlash"),
        Branch(Test("bw_util", "<", 0.6), "choose", "eagle", "{bw_util:.0%} bandwidth in use (< 60%): EAGLE"),
        Branch(None, "pass", None, "{bw_util:.0%} bandwidth in use (60-75%): the rule says nothing"),
    )),
    Rule("score_variance", "score_variance", "How much do the output scores vary?", f"{ARTICLE}, further signals", (
        Branch(Test("score_variance", "<", 0.05), "choose", "eagle", "output-score variance {score_variance:g}: EAGLE"),
        Branch(Test("score_variance", ">", 0.18), "choose", "mtp", "output-score variance {score_variance:g}: MTP"),
        Branch(None, "pass", None, "output-score variance {score_variance:g} (0.05-0.18): the rule says nothing"),
    )),
    Rule("team", "cuda_experience", "How much CUDA experience does the team have?", f"{ARTICLE}, rule 4", (
        Branch(Test("cuda_experience", "==", "none"), "choose", "dspark",
               "no CUDA experience: DSpark, whose scheduler tunes the draft length by itself"),
        Branch(Test("cuda_experience", "==", "expert"), "choose", "dflash", "an experienced systems team: DFlash"),
        Branch(None, "pass", None, "some CUDA experience: the rule says nothing"),
    )),
    Rule("fallback", None, "Did any rule choose?", "specbench", (
        Branch(None, "choose", "dspark", "no rule chose: DSpark adapts its draft length to the acceptance it sees"),
    )),
    Rule("pcie", "pcie_gen", "Which PCIe generation links the GPU?", f"{ARTICLE}, rule 3", (
        Branch(Test("pcie_gen", ">=", 5), "combine", "eagle+dspark", "PCIe {pcie_gen}.0: EAGLE+DSpark", chosen="eagle"),
        Branch(None, "avoid", "eagle+mtp", "PCIe {pcie_gen}.0: avoid EAGLE+MTP"),
    )),
)


def members(strategy: str) -> frozenset[str]:
    return frozenset(strategy.split("+")) - {BASELINE}


def short_draft_knobs(strategy: str, drafts: int) -> dict[str, dict[str, Any]]:
    """Knobs that keep one sequence's verified tokens per step at `drafts` + 1, as each method declares them."""
    return {m: definition(m).short_draft(drafts) for m in sorted(members(strategy))}


@dataclass(frozen=True)
class Step:
    """One node on a decision path: the question, what the workload answered, what followed."""

    node: str
    question: str
    answer: str
    outcome: str

    def as_json(self) -> dict[str, str]:
        return {"node": self.node, "question": self.question, "answer": self.answer, "outcome": self.outcome}


@dataclass(frozen=True)
class Alternative:
    strategy: str
    reason: str


@dataclass
class PriorOutcome:
    strategy: str
    knobs: dict[str, dict[str, Any]]
    path: list[Step]
    alternatives: list[Alternative]
    avoid: dict[frozenset[str], str] = field(default_factory=dict)  # pairs no recommendation may contain -> why
    branches: dict[str, Branch] = field(default_factory=dict)  # rule id -> the branch its test selected
    decisive: set[str] = field(default_factory=set)  # rules whose branch changed the outcome


def _fields(workload: Workload) -> dict[str, Any]:
    view = {name: getattr(workload, name) for name in workload.__dataclass_fields__}
    budget = workload.verify_budget
    return {**view, "ridge_tokens": workload.ridge_tokens, "verify_budget": budget, "short_k": max(budget - 1, 1)}


def evaluate(workload: Workload, rules: tuple[Rule, ...] = PRIOR) -> PriorOutcome:
    """Walk the rules for `workload`: the strategy, its knobs, the path and the runner-up choices."""
    fields = _fields(workload)
    out = PriorOutcome("", {}, [], [])
    decided_by = ""
    skipped: list[Alternative] = []
    runner_ups: list[Alternative] = []
    cap: int | None = None
    for rule in rules:
        branch = rule.branch_for(workload)
        if branch is None:
            out.path.append(Step(rule.id, rule.question, "not given", "skipped"))
            continue
        out.branches[rule.id] = branch
        reason = outcome = branch.reason.format(**fields)
        decisive = branch.verb in ("skip", "cap", "avoid")
        choice = out.strategy
        if branch.verb in ("choose", "baseline"):
            if any(branch.strategy == s.strategy for s in skipped):
                outcome = f"{reason}; but {branch.strategy} was skipped earlier"
            elif not choice:
                out.strategy, decided_by, decisive = branch.strategy, rule.id, True
                outcome = f"{reason} -> {branch.strategy}"
            elif rule.signal is None:
                outcome = f"not needed: the {decided_by} rule chose {choice}"
            else:
                runner_ups.append(Alternative(branch.strategy, f"{reason}; the {decided_by} rule decided first"))
                outcome = f"{reason}; not consulted: the {decided_by} rule chose {choice}"
        elif branch.verb == "skip":
            skipped.append(Alternative(branch.strategy, reason))
        elif branch.verb == "cap":
            cap = fields["short_k"]
        elif branch.verb == "combine" and choice == branch.chosen:
            if cap is not None:
                runner_ups.append(Alternative(branch.strategy, f"{reason}; under load a merged trie widens every "
                                                               "verify forward"))
                outcome = f"{reason}; not combined under load"
            else:
                runner_ups.append(Alternative(choice, f"{reason}: the pair verifies both drafters' proposals"))
                out.strategy, decisive = branch.strategy, True
                outcome = f"{reason} -> {branch.strategy}"
        elif branch.verb == "combine":
            outcome = f"{reason}; applies to a {branch.chosen} choice only"
        elif branch.verb == "avoid":
            out.avoid[members(branch.strategy)] = reason
        if decisive:
            out.decisive.add(rule.id)
        out.path.append(Step(rule.id, rule.question, _answer(rule, workload), outcome))
    assert out.strategy, "the fallback rule always chooses"
    out.knobs = short_draft_knobs(out.strategy, cap) if cap is not None and out.strategy != BASELINE else {}
    out.alternatives = _two_alternatives(out.strategy, runner_ups + skipped, workload, decided_by)
    return out


def _answer(rule: Rule, workload: Workload) -> str:
    return "-" if rule.signal is None else str(getattr(workload, rule.signal))


def _two_alternatives(choice: str, found: list[Alternative], workload: Workload, decided_by: str) -> list[Alternative]:
    """The first two distinct runner-ups (then what was skipped), filled with the fallback, `ar` and ngram."""
    batch = workload.batch_size
    fill = [Alternative("dspark", f"the fallback; the {decided_by} rule decided first"),
            Alternative(BASELINE, f"plain decoding; the prior expects speculation to pay at batch {batch}"),
            Alternative("ngram", "prompt lookup needs no drafter forward, but its drafts still widen every verify")]
    chosen: list[Alternative] = []
    for alt in found + fill:
        if alt.strategy != choice and all(alt.strategy != c.strategy for c in chosen):
            chosen.append(alt)
    return chosen[:2]


def prior_markdown(rules: tuple[Rule, ...] = PRIOR) -> str:
    """The rules as a Markdown list, one line per branch, in evaluation order."""
    lines = ["# The prior: the practitioners' decision rules and the load rule", ""]
    for number, rule in enumerate(rules, start=1):
        lines.append(f"{number}. **{rule.id}** ({rule.signal or 'no signal'}): {rule.question} _{rule.source}_")
        lines += [f"   - `{b.describe()}`" for b in rule.branches]
    return "\n".join(lines) + "\n"
