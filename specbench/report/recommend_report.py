"""What `specbench recommend` prints: the answer, its alternatives, the path (--explain), the learned tree, and
the answer under load."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from specbench.core.engine_names import SPECBENCH, label
from specbench.core.markdown import markdown_table

if TYPE_CHECKING:
    from specbench.recommender.learn import LearnReport
    from specbench.recommender.prior import Step
    from specbench.recommender.recommendation import Recommendation

Node = tuple[str, list["Node"]]


def speedup_text(speedup: float | None, ci: tuple[float, float] | None) -> str:
    if speedup is None:
        return "no figure"
    return f"{speedup:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def summary_lines(rec: Recommendation) -> list[str]:
    config = rec.config
    knobs = ", ".join(f"{m}.{k}={v}" for m, values in sorted(config.knobs.items()) for k, v in sorted(values.items()))
    figure = speedup_text(rec.speedup, rec.ci) if rec.speedup is not None else \
        "none: the prior has no measured figure (measure it with the command below)"
    engine = "" if rec.config.engine == SPECBENCH else f", in {rec.config.engine}"
    lines = [f"recommend: {rec.strategy} ({rec.source}{engine})",
             f"expected speedup over ar: {figure}",
             f"configuration: {config.toml or knobs or 'defaults'}",
             f"run it: {config.command()}",
             f"workload: {rec.workload.describe()}"]
    if rec.rests_on:
        lines.append("rests on: " + ", ".join(rec.rests_on))
    lines += [f"incomplete evidence: {note}" for note in rec.incomplete]
    if rec.unmeasured:
        lines.append(f"unmeasured: the evidence cannot rank {', '.join(u.strategy for u in rec.unmeasured)} against "
                     f"{rec.strategy} (below: what the prior or weaker evidence expects)")
        lines.append(f"measure them: {rec.measure}")
    if rec.source != "prior":
        verdict = "agrees" if rec.prior_agrees else "differs: the evidence decides"
        lines.append(f"prior: {rec.prior.strategy} ({verdict})")
    lines += [f"skipped (unreadable): {s}" for s in rec.skipped]
    return lines


ALTERNATIVE_HEADERS = ("strategy", "source", "speedup [95% CI]", "why not")


def alternatives_rows(rec: Recommendation) -> list[tuple[str, str, str, str]]:
    """The recommendation, its two alternatives and the candidates the evidence leaves out."""
    rows = [(label(rec.strategy, rec.config.engine), rec.source, speedup_text(rec.speedup, rec.ci), "recommended")]
    rows += [(label(a.strategy, a.engine), a.source, speedup_text(a.speedup, a.ci), a.reason) for a in rec.alternatives]
    return rows + [(u.strategy, "unmeasured", "no figure", u.expected) for u in rec.unmeasured]


def alternatives_table(rec: Recommendation, markdown: bool) -> Table | str:
    """The alternatives: a rich table on a terminal, Markdown when piped."""
    rows, headers = alternatives_rows(rec), ALTERNATIVE_HEADERS
    if markdown:
        return markdown_table(headers, rows) + "\n"
    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    return table


def _step(step: Step) -> str:
    return f"{step.node}: {step.question} {step.answer} -> {step.outcome}"


def explain_nodes(rec: Recommendation) -> Node:
    """The decision as a tree of labels: the path taken, the evidence ranked, the prior beside it."""
    children: list[Node] = [(f"workload: {rec.workload.describe()}", []),
                            ("path", [(_step(s), []) for s in rec.path])]
    if rec.ranking:
        sources = list(dict.fromkeys(path for a in rec.ranking for path in a.candidate.rests_on))
        children.append(("evidence, best first", [
            (f"{label(a.candidate.strategy, a.candidate.engine)}: {a.candidate.source} "
             f"{speedup_text(a.candidate.speedup, a.candidate.ci)}"
             + (f" over {a.candidate.prompts} prompts" if a.candidate.prompts else "")
             + (f", needs {a.need_bytes / 1e9:.2f} GB" if a.need_bytes is not None else "")
             + (f"; {a.excluded}" if a.excluded else "")
             + (f"; {a.candidate.note}" if a.candidate.note else "")
             + (f"; incomplete evidence: {a.candidate.incomplete}" if a.candidate.incomplete else "")
             + " (from " + ", ".join(f"[{sources.index(p) + 1}]" for p in a.candidate.rests_on) + ")", [])
            for a in rec.ranking] + [(f"[{i}] {path}", []) for i, path in enumerate(sources, start=1)]))
    if rec.unmeasured:
        children.append((f"unmeasured candidates (measure them: {rec.measure})",
                         [(f"{u.strategy}: {u.expected}", []) for u in rec.unmeasured]))
    if rec.source != "prior":
        children.append((f"the prior says {rec.prior.strategy}", [(_step(s), []) for s in rec.prior.path]))
    if rec.unmatched:
        children.append(("not matching the workload", [(note, []) for note in rec.unmatched]))
    if rec.skipped:
        children.append(("skipped (unreadable)", [(note, []) for note in rec.skipped]))
    return f"{rec.strategy} ({rec.source})", children


def rich_tree(node: Node) -> Tree:
    def add(parent: Tree, nodes: list[Node]) -> None:
        for label, children in nodes:
            add(parent.add(Text(label)), children)

    label, children = node
    tree = Tree(Text(label, style="bold"))
    add(tree, children)
    return tree


def plain_tree(node: Node, depth: int = 0) -> str:
    label, children = node
    return "  " * depth + label + "\n" + "".join(plain_tree(child, depth + 1) for child in children)


def learn_lines(report: LearnReport) -> list[str]:
    lines = [f"learned tree: {report.reason}"]
    if report.fitted:
        lines += [f"  leaf: {leaf.conditions} -> {leaf.learned} ({leaf.prompts} prompts, {leaf.purity:.0%}); "
                  f"prior says {leaf.prior} ({leaf.prior_agree}/{leaf.prompts} agree)" for leaf in report.leaves]
        lines += [f"  prior {node.rule} `{node.branch}`: {node.verdict} ({node.measured_agree}/{node.claims} "
                  f"of {node.reached} prompts)" for node in report.nodes if node.claims]
    lines += [f"  left out: {note}" for note in report.notes]
    lines += [f"  wrote {path}" for path in report.files]
    return lines


def under_load_lines(rec: dict[str, Any]) -> list[str]:
    """The recommendation at a concurrency (recommender/under_load.py) as sentences."""
    choice, n = rec["choice"], rec["concurrency"]
    if choice is None:
        head = f"at concurrency {n}: plain decoding (ar); no strategy measured there pays losslessly"
    else:
        low, high = choice["tpot_speedup_ci"]
        head = (f"at concurrency {n}: {choice['strategy']}, TPOT {choice['tpot_speedup']:.2f}x ar's "
                f"(95% CI {low:.2f}-{high:.2f})")
        if low <= 1:
            head += " (the interval includes 1: not clearly faster than ar)"
        if choice["crossover"] is not None:
            head += f"; it stops paying at concurrency {choice['crossover']}"
    out = [head]
    for c in rec["candidates"]:
        why = " (greedy mismatches: not offered)" if c["mismatches"] else ""
        stops = f", stops paying at {c['crossover']}" if c["crossover"] is not None else ""
        out.append(f"  {c['strategy']}: TPOT speedup {c['tpot_speedup']:.2f}{stops}{why}  [{c['run']}]")
    return out
