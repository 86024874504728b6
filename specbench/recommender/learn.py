"""`recommend --learn`: a decision tree fitted to what the results measured, set beside the prior.

One example per measured prompt (run, prompt, turn, repeat): the features the runs record (the
measuring GPU's bandwidth, memory and PCIe generation, the category, temperature, batch size,
prompt and output length) and as label the strategy that was fastest on that prompt (`ar`
included: when nothing beats it, it wins). A strategy whose greedy output differed from `ar` is
left out of the race. The tree (scikit-learn) is only fitted when the evidence can carry it:
enough prompts, more than one winner, and held-out accuracy above always answering the most
common winner by a one-sided binomial test at 5%; otherwise the report says which test failed
instead of drawing noise.

Written under results/decision_tree/: learned.txt (scikit-learn's text export), learned.md (the
leaves, each beside what the prior says for its prompts, and the prior's rules one by one with
the evidence counts for and against them), learned.png (the drawing) and prior.md (the rules).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from specbench.analysis.hardware import GpuProfile
from specbench.core.files import atomic_path, write_atomic
from specbench.core.markdown import markdown_table
from specbench.methods.names import BASELINE
from specbench.recommender.evidence import Evidence
from specbench.recommender.prior import PRIOR, Branch, PriorOutcome, evaluate, members, prior_markdown
from specbench.recommender.workload import Workload

NUMERIC_FEATURES = ("gpu_bandwidth_gbs", "gpu_memory_gb", "pcie_gen", "temperature", "batch_size",
                    "prompt_tokens", "output_tokens")
RECORDED_SIGNALS = {"task", "pcie_gen", "batch_size", None}
"""Prior signals the runs record (the fallback reads none); the others cannot be checked against them."""
MIN_EXAMPLES = 30
MAX_P = 0.05  # the tree's held-out accuracy must beat always answering the most common winner at this level
FOLDS = 5


@dataclass(frozen=True)
class NodeCheck:
    """One branch of the prior against the measured winners (and the learned tree) of the prompts it reaches."""

    rule: str
    branch: str
    reached: int  # prompts whose workload selects this branch
    claims: int  # of those, prompts where the branch shapes the prior's answer
    measured_agree: int
    learned_agree: int
    measured_winners: str  # the most common winners among the reached prompts
    verdict: str


@dataclass(frozen=True)
class LeafCheck:
    conditions: str
    prompts: int
    learned: str  # the leaf's winner
    purity: float  # share of its prompts that winner won
    prior: str  # the prior's most common answer for the leaf's prompts
    prior_agree: int  # prompts where the prior's answer is the leaf's winner


@dataclass
class LearnReport:
    fitted: bool
    reason: str  # why not fitted, or a one-line summary of the fit
    examples: int
    winners: dict[str, int]
    cv_accuracy: float | None = None
    baseline_accuracy: float | None = None
    leaves: list[LeafCheck] = field(default_factory=list)
    nodes: list[NodeCheck] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"fitted": self.fitted, "reason": self.reason, "examples": self.examples, "winners": self.winners,
                "cv_accuracy": self.cv_accuracy, "baseline_accuracy": self.baseline_accuracy,
                "leaves": [vars(leaf) for leaf in self.leaves], "nodes": [vars(node) for node in self.nodes],
                "files": [str(f) for f in self.files], "notes": self.notes}


def examples(evidence: Evidence, profiles: dict[str, GpuProfile]) -> tuple[pd.DataFrame, list[str]]:
    """One row per measured prompt: features, the category, the fastest strategy; and notes on runs left out."""
    records, notes = [], []
    for record in evidence.runs:
        if record.device not in profiles:
            notes.append(f"{record.path}: measured on an unprofiled device, left out")
            continue
        gpu = profiles[record.device]
        rows = record.rows[~record.rows["mismatch"].fillna(False).astype(bool)] if len(record.rows) else record.rows
        for (*_prompt, batch), group in rows.groupby(["prompt_id", "turn", "repeat", "batch_size"], sort=False):
            ar = group[group["strategy"] == BASELINE]
            if ar.empty or group["speedup"].isna().all():
                continue
            records.append({
                "run": record.path, "gpu": gpu.name, "category": str(ar["category"].iloc[0]),
                "gpu_bandwidth_gbs": gpu.bandwidth_gbs, "gpu_memory_gb": gpu.memory_gb, "pcie_gen": gpu.pcie_gen or 0,
                "temperature": record.temperature, "batch_size": int(batch),
                "prompt_tokens": int(ar["prompt_tokens"].iloc[0]), "output_tokens": int(ar["new_tokens"].iloc[0]),
                "winner": str(group.loc[group["speedup"].idxmax(), "strategy"]),
            })
    return pd.DataFrame.from_records(records), notes


def _design(frame: pd.DataFrame) -> pd.DataFrame:
    categories = pd.get_dummies(frame["category"], prefix="category", prefix_sep="=", dtype=float)
    return pd.concat([frame[list(NUMERIC_FEATURES)].astype(float), categories], axis=1)


def _refusal(frame: pd.DataFrame, design: pd.DataFrame) -> tuple[str | None, float | None, float | None]:
    """Why the evidence cannot carry a tree (None when it can), and the held-out accuracies."""
    from sklearn.dummy import DummyClassifier
    from sklearn.model_selection import KFold, cross_val_predict, cross_val_score

    n = len(frame)
    if n < MIN_EXAMPLES:
        return f"too little evidence: {n} measured prompts, at least {MIN_EXAMPLES} needed", None, None
    winners = frame["winner"].value_counts()
    if len(winners) < 2:
        return f"too little evidence: {winners.index[0]} is fastest on all {n} prompts", None, None
    if (design.nunique() <= 1).all():
        return f"too little evidence: all {n} prompts share one workload, nothing to split on", None, None
    folds = KFold(FOLDS, shuffle=True, random_state=0)
    held_out = cross_val_predict(_tree(n), design, frame["winner"], cv=folds)
    correct = int((held_out == frame["winner"].to_numpy()).sum())
    majority = float(cross_val_score(DummyClassifier(strategy="most_frequent"), design, frame["winner"],
                                     cv=folds).mean())
    p_value = binomtest(correct, n, min(majority, 1 - 1e-9), alternative="greater").pvalue
    accuracy = correct / n
    if p_value >= MAX_P:
        return (f"too little evidence: on held-out prompts the tree picks the winner {accuracy:.0%} of the time, "
                f"not significantly above always answering {winners.index[0]} ({majority:.0%}; p = {p_value:.2f})",
                accuracy, majority)
    return None, accuracy, majority


def _tree(n: int):
    from sklearn.tree import DecisionTreeClassifier

    return DecisionTreeClassifier(max_depth=4, min_samples_leaf=max(5, n // 20), random_state=0)


def learn(evidence: Evidence, profiles: dict[str, GpuProfile], out_dir: Path) -> LearnReport:
    """Fit the tree where the evidence carries one, compare it with the prior and write the files."""
    frame, notes = examples(evidence, profiles)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "prior.md", prior_markdown())
    winners = {str(k): int(v) for k, v in frame["winner"].value_counts().items()} if len(frame) else {}
    design = _design(frame) if len(frame) else pd.DataFrame()
    refusal, cv, majority = _refusal(frame, design)
    if refusal is not None:
        for stale in ("learned.txt", "learned.png"):
            (out_dir / stale).unlink(missing_ok=True)
        write_atomic(out_dir / "learned.md", f"# Learned decision tree\n\nNot fitted: {refusal}.\n")
        return LearnReport(False, refusal, len(frame), winners, cv, majority,
                           files=[out_dir / "learned.md", out_dir / "prior.md"], notes=notes)
    tree = _tree(len(frame)).fit(design, frame["winner"])
    learned = pd.Series(tree.predict(design), index=frame.index)
    priors = _prior_answers(frame, profiles)
    report = LearnReport(True, f"fitted on {len(frame)} measured prompts: held-out accuracy {cv:.0%} against "
                               f"{majority:.0%} for always answering {frame['winner'].mode()[0]}",
                         len(frame), winners, cv, majority, notes=notes)
    report.leaves = _leaf_checks(tree, design, frame, priors)
    report.nodes = _node_checks(frame, learned, priors)
    report.files = _write(out_dir, tree, design, report)
    return report


# -- comparison with the prior ---------------------------------------------------------------


def _prior_answers(frame: pd.DataFrame, profiles: dict[str, GpuProfile]) -> list[PriorOutcome]:
    """The prior's outcome for each prompt's workload as the runs record it (other signals: not given)."""
    cache: dict[tuple, PriorOutcome] = {}
    answers = []
    for gpu, category, batch, temperature in frame[["gpu", "category", "batch_size", "temperature"]].itertuples(
            index=False):
        key = (gpu, category, batch, temperature)
        if key not in cache:
            profile = profiles[gpu]
            cache[key] = evaluate(Workload(gpu=profile, gpu_origin="recorded", task=category, batch_size=int(batch),
                                           temperature=float(temperature), pcie_gen=profile.pcie_gen))
        answers.append(cache[key])
    return answers


def _claim_holds(branch: Branch, prior: PriorOutcome, winner: str) -> bool:
    """Whether a measured winner bears out what `branch` contributed to the prior's answer."""
    if branch.verb == "skip":
        return winner != branch.strategy
    if branch.verb == "avoid":
        return not members(branch.strategy) <= members(winner)
    if branch.verb == "cap":
        return winner != BASELINE
    return winner == prior.strategy


def _node_checks(frame: pd.DataFrame, learned: pd.Series, priors: list[PriorOutcome]) -> list[NodeCheck]:
    checks = []
    winners = frame["winner"].tolist()
    predictions = learned.tolist()
    for rule in PRIOR:
        if rule.signal not in RECORDED_SIGNALS:
            checks.append(NodeCheck(rule.id, f"reads {rule.signal}", 0, 0, 0, 0, "-",
                                    "not recorded by runs: no evidence either way"))
            continue
        for branch in rule.branches:
            reached = [i for i, p in enumerate(priors) if p.branches.get(rule.id) is branch]
            claimed = [i for i in reached if rule.id in priors[i].decisive]
            measured = sum(_claim_holds(branch, priors[i], winners[i]) for i in claimed)
            tree = sum(_claim_holds(branch, priors[i], predictions[i]) for i in claimed)
            top = ", ".join(f"{s} {c}" for s, c in Counter(winners[i] for i in reached).most_common(2)) or "-"
            if not reached:
                verdict = "no evidence"
            elif not claimed:
                verdict = "makes no claim here"
            elif measured * 2 > len(claimed):
                verdict = "agrees"
            else:
                verdict = "disagrees"
            checks.append(NodeCheck(rule.id, branch.describe(), len(reached), len(claimed), measured, tree, top,
                                    verdict))
    return checks


def _leaf_conditions(tree, names: list[str]) -> dict[int, str]:
    """Leaf id -> the conditions on the path to it, one-hot categories read as `category = x`."""
    t = tree.tree_
    paths: dict[int, str] = {}

    def walk(node: int, conditions: list[str]) -> None:
        if t.children_left[node] == t.children_right[node]:
            paths[node] = " and ".join(conditions) or "every prompt"
            return
        name, threshold = names[t.feature[node]], t.threshold[node]
        if name.startswith("category="):
            left, right = f"category != {name[9:]}", f"category = {name[9:]}"
        else:
            left, right = f"{name} <= {threshold:g}", f"{name} > {threshold:g}"
        walk(t.children_left[node], [*conditions, left])
        walk(t.children_right[node], [*conditions, right])

    walk(0, [])
    return paths


def _leaf_checks(tree, design: pd.DataFrame, frame: pd.DataFrame, priors: list[PriorOutcome]) -> list[LeafCheck]:
    leaf_of = tree.apply(design)
    conditions = _leaf_conditions(tree, list(design.columns))
    checks = []
    for leaf in sorted(set(leaf_of)):
        index = np.flatnonzero(leaf_of == leaf)
        counts = frame["winner"].iloc[index].value_counts()
        learned = str(tree.classes_[np.argmax(tree.tree_.value[leaf][0])])
        prior_answers = Counter(priors[i].strategy for i in index)
        checks.append(LeafCheck(conditions[leaf], len(index), learned, float(counts.get(learned, 0) / len(index)),
                                prior_answers.most_common(1)[0][0], prior_answers.get(learned, 0)))
    return checks


# -- files -----------------------------------------------------------------------------------


def _markdown(report: LearnReport) -> str:
    lines = ["# Learned decision tree", "", f"{report.reason}.", "",
             "Winners: " + ", ".join(f"{s} {n}" for s, n in report.winners.items()), "",
             "## Leaves beside the prior", "",
             markdown_table(("conditions", "prompts", "learned winner", "share", "prior says", "prior agrees"),
                            [(leaf.conditions, leaf.prompts, leaf.learned, f"{leaf.purity:.0%}", leaf.prior,
                              f"{leaf.prior_agree}/{leaf.prompts}") for leaf in report.leaves])]
    lines += ["", "## The prior's rules against the evidence", "",
              "Reached: prompts whose workload selects the branch; claims: those where it shapes the prior's answer; "
              "agree: claims the measured winner (or the learned tree) bears out.", "",
              markdown_table(("rule", "branch", "reached", "claims", "measured agree", "learned agree",
                              "measured winners", "verdict"),
                             [(n.rule, f"`{n.branch}`", n.reached, n.claims, n.measured_agree, n.learned_agree,
                               n.measured_winners, n.verdict) for n in report.nodes])]
    if report.notes:
        lines += ["", "## Left out", ""] + [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def _write(out_dir: Path, tree, design: pd.DataFrame, report: LearnReport) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.tree import export_text, plot_tree

    names = list(design.columns)
    text = export_text(tree, feature_names=names, class_names=[str(c) for c in tree.classes_])
    write_atomic(out_dir / "learned.txt", f"# {report.reason}\n{text}")
    write_atomic(out_dir / "learned.md", _markdown(report))
    leaves, depth = tree.get_n_leaves(), tree.get_depth()
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * leaves), max(3.0, 2.0 * (depth + 1))))
    plot_tree(tree, feature_names=names, class_names=[str(c) for c in tree.classes_], filled=True, rounded=True,
              impurity=False, ax=ax, fontsize=9)
    ax.set_title(f"Fastest strategy learned from {report.examples} measured prompts")
    png = out_dir / "learned.png"
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [out_dir / "learned.txt", out_dir / "learned.md", png, out_dir / "prior.md"]
