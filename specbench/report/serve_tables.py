"""A serve run as people read it: one table per load level (fitting 80 columns) and the decisions under them."""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from specbench.core.records.serve_records import ServeLevel, ServeVerdict
from specbench.methods.names import BASELINE
from specbench.report.run_report import Line

if TYPE_CHECKING:
    from specbench.core.records.serve_records import ServeResult


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _speedup(entry: ServeLevel) -> str:
    value, (low, high) = entry.tpot_speedup, entry.tpot_speedup_ci or (None, None)
    if value is None:
        return "-"
    return f"{value:.2f}" + (f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def _lossless(entry: ServeLevel) -> str:
    check = entry.lossless
    return "-" if check is None else f"{check.mismatches}/{check.compared}"


LEFT = ("strategy", "TPOT speedup\n(95% CI)")


def level_tables(levels: list[ServeLevel], slo: bool) -> list[Table]:
    """One table per level, its strategies as rows, `ar` first."""
    tables = []
    for key in dict.fromkeys(e.level for e in levels):
        rows = [e for e in levels if e.level == key]
        first = rows[0]
        title = (f"concurrency {first.concurrency}" if first.concurrency is not None
                 else f"{first.request_rate:g} requests/s")
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title_justify="left")
        for header in ("strategy", "tok/s", "TTFT\np50", "TPOT\np50", "TPOT\np99", "tau", "TPOT speedup\n(95% CI)",
                       "err", "diff", *(["good\nreq/s"] if slo else [])):
            table.add_column(header, justify="left" if header in LEFT else "right", no_wrap=True)
        for e in sorted(rows, key=lambda e: e.strategy != BASELINE):
            cells = [e.strategy, _num(e.output_tok_s), _num(e.ttft_ms.p50), _num(e.tpot_ms.p50, 1),
                     _num(e.tpot_ms.p99, 1), _num(e.speculation.tau if e.speculation else None, 2), _speedup(e),
                     f"{e.errors / e.requests:.0%}" if e.errors else "0", _lossless(e)]
            if slo:
                cells.append(_num(e.goodput_req_s, 2))
            table.add_row(*cells)
        tables.append(table)
    return tables


def levels_csv(levels: list[ServeLevel]) -> str:
    """Every level's figures as a CSV row: nested ones flattened (ttft_ms_p50, speculation_tau, ...), the
    intervals as _low and _high; per-position and per-request lists left to summary.json."""
    import pandas as pd

    flat = pd.json_normalize([e.as_dict() for e in levels], sep="_", max_level=2)  # ttft_ms_more_p95 too
    for interval in ("tpot_speedup_ci", "throughput_ratio_ci", "slo_met_ci"):
        if interval in flat:
            bounds = flat.pop(interval).map(lambda v: v if isinstance(v, list) else [None, None])
            flat[f"{interval}_low"], flat[f"{interval}_high"] = bounds.str[0], bounds.str[1]
    nested = [c for c in flat if flat[c].map(lambda v: isinstance(v, (list, dict))).any()]
    return flat.drop(columns=nested).to_csv(index=False)


def decisions(strategies: dict[str, ServeVerdict], levels: list[ServeLevel]) -> list[str]:
    """Where each strategy stops paying, what it holds within the SLO, and greedy mismatches, as sentences."""
    lines = []
    highest = max((e.concurrency for e in levels if e.concurrency is not None), default=None)
    for name, figures in strategies.items():
        if name == BASELINE:
            continue
        failed = figures.errors or {}
        if failed:
            where = ", ".join(f"{count} at {key}" for key, count in failed.items())
            lines.append(f"{name}: errors (failed requests, its own and ar's: {where}): no verdict there, no vLLM "
                         "setting exported")
        if highest is not None:
            stops = figures.crossover
            own = [e for e in levels if e.strategy == name and e.concurrency is not None]
            at = next((e for e in own if e.concurrency == (stops or highest)), None)
            there = ""
            if at is not None and at.tpot_speedup is not None:
                low, high = at.tpot_speedup_ci
                there = f" (TPOT speedup {at.tpot_speedup:.2f}, 95% CI {low:.2f}-{high:.2f})"
            undecided = figures.undecided or []
            if stops is not None:
                lines.append(f"{name}: stops paying at concurrency {stops}{there}")
            elif not failed and not undecided and all(e.tpot_speedup is not None for e in own):
                lines.append(f"{name}: still pays at concurrency {highest}{there}, the highest measured")
            if undecided:
                where = "" if stops is not None or failed else "; where it stops paying is undecided"
                lines.append(f"{name}: too small to decide at {', '.join(undecided)} (the TPOT speedup's 95% interval "
                             f"holds 1: too few requests to tell paying from not; --requests){where}")
    for name, figures in strategies.items():
        if figures.slo_share is not None:
            lines.append(capacity_line(name, figures))
    few = [f"{e.strategy} at {e.level} ({e.tpot_ms.n})" for e in levels if e.few_for_p99]
    if few:
        lines.append(f"p99s from too few requests to tell from the maximum (requests): {', '.join(few)}")
    for e in levels:
        if not e.complete:
            lines.append(f"{e.strategy} at {e.level}: incomplete (its server failed or died during it; "
                         f"{e.errors} requests failed): --resume measures it again")
        check = e.lossless
        if check and check.mismatches:
            first = min(check.first_divergence.values())
            lines.append(f"LOSSLESS CHECK: {e.strategy} at {e.level}: {check.mismatches} of "
                         f"{check.compared} greedy answers differ from ar's; earliest divergence at "
                         f"{check.unit} {first}")
    return lines


def capacity_line(name: str, figures: ServeVerdict) -> str:
    """Where the strategy holds the SLO for its share of requests, and the levels too small to decide it."""
    held, share = figures.capacity, figures.slo_share
    line = (f"{name}: {share:.0%} of requests meet every SLO up to concurrency {held}" if held is not None
            else f"{name}: {share:.0%} of requests meeting every SLO is not shown at the lowest concurrency")
    undecided = figures.capacity_undecided or []
    if undecided:
        line += (f"; too small to decide at {', '.join(undecided)} (the share's 95% interval holds {share:.0%}: "
                 f"{requests_to_show(share)} requests all within it would show it)")
    return line


def requests_to_show(share: float) -> int:
    """The fewest requests, every one within the SLO, whose exact 95% interval lies at or above `share`: the
    lower bound of n hits in n is 0.025 ** (1 / n)."""
    return math.ceil(math.log(0.025) / math.log(share))


LEGEND = ("tok/s: output tokens/s of the server; TTFT, TPOT: ms; tau: tokens per verify step (server's counters); "
          "TPOT speedup: ar's TPOT over the strategy's, paired by request; err: share of requests that failed; "
          "diff: greedy answers differing from ar's / compared")


def serve_report(result: ServeResult) -> tuple[list[Line], list[Table | Line], list[Line]]:
    """What is said of a serve run: its notes, first; a table per level with the legend and the decisions under
    them; and last, how to resume it where it is incomplete."""
    notes = [Line(f"note: {note}") for note in result.notes]
    body: list[Table | Line] = [*level_tables(result.levels, bool(result.slo)), Line(LEGEND, "dim")]
    body += [Line(line, "bold red" if line.startswith("LOSSLESS") else None)
             for line in decisions(result.strategies, result.levels)]
    after = [] if result.complete else \
        [Line(f"incomplete: {', '.join(result.incomplete)}; resume it with: specbench serve --resume "
              f"{shlex.quote(str(result.path))}")]
    return notes, body, after
