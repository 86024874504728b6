"""`specbench recommend`: a strategy for a workload and a GPU, from the evidence first and the prior second."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from specbench.cli import options
from specbench.cli.app import app, err, out, print_table, user_errors, write_page
from specbench.engines.engine_registry import ENGINE_NAMES

if TYPE_CHECKING:
    from specbench.recommender import LearnReport, Recommendation


@app.command()
def recommend(
    gpu: Annotated[Optional[str], typer.Option(help="GPU profile (see `specbench hardware`); default: the local GPU, else cpu.")] = None,
    task: Annotated[Optional[str], typer.Option(help="Task category: code, chat, creative, legal, high_precision, ...")] = None,
    batch_size: Annotated[int, typer.Option(help="Sequences decoded together.")] = 1,
    concurrency: Annotated[Optional[int], typer.Option(help="Requests served at once: answer from `specbench serve` runs that measured this concurrency on a real server.", show_default="none")] = None,
    context_len: Annotated[Optional[int], typer.Option(help="Prompt + answer tokens per sequence, for the memory check (default: the evidence's own lengths).")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of the workload (0 = greedy).")] = 0.0,
    vram_used: Annotated[Optional[float], typer.Option(help="GB of GPU memory the deployment uses with plain decoding.")] = None,
    pcie: Annotated[Optional[int], typer.Option(help="PCIe generation, 3-6 (default: the profile's).")] = None,
    bw_util: Annotated[Optional[float], typer.Option(help="Memory-bandwidth utilisation of the deployment, a fraction in (0, 1]: 0.8 for 80%.")] = None,
    cuda_experience: Annotated[Optional[str], typer.Option(help="The team's CUDA experience: none, some or expert.")] = None,
    score_variance: Annotated[Optional[float], typer.Option(help="Variance of the output scores (the EAGLE/MTP/DFlash/DSpark practitioners' comparison's signal).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Only evidence of this model (as run.json names it; default: any).")] = None,
    engine: Annotated[Optional[str], typer.Option(help=f"The deployment's engine, one of {', '.join(ENGINE_NAMES)}: its measured figures rank first (default: any engine's).")] = None,
    results: Annotated[Optional[Path], typer.Option(help="Results directory with runs and tuned studies (default results/).")] = None,
    profiles: options.Profiles = None,
    learn: Annotated[bool, typer.Option("--learn", help="Also fit a decision tree to every readable result and compare it with the prior (writes RESULTS/decision_tree/).")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show the path through the evidence and the prior.")] = False,
    html: Annotated[Optional[Path], typer.Option(help="Also write one self-contained HTML page of the recommendation and the runs and studies it rests on.", metavar="FILE")] = None,
    as_json: options.Json = False,
) -> None:
    """Pick a strategy and its settings for a workload on a GPU."""
    from specbench.analysis.hardware import load_profiles
    from specbench.core.errors import SpecbenchError
    from specbench.core.strict_json import dumps
    from specbench.recommender import learn as fit_tree
    from specbench.recommender import make_workload
    from specbench.recommender import recommend as choose
    from specbench.recommender.evidence import load_evidence

    with user_errors():
        if results is not None and not results.is_dir():
            raise SpecbenchError(f"results directory {results} does not exist")
        results_dir = results or Path("results")
        if concurrency is not None:
            from specbench.core.ranges import check_range
            from specbench.recommender.under_load import recommend_for_load
            from specbench.report.recommend_report import under_load_lines

            check_range("--concurrency", concurrency)
            rec = recommend_for_load(results_dir, concurrency, model)
            if as_json:
                sys.stdout.write(dumps(rec, indent=2) + "\n")
            else:
                for line in under_load_lines(rec):
                    out.print(line, highlight=False, markup=False, soft_wrap=True)
            return
        workload = make_workload(gpu, task, batch_size, context_len, temperature, vram_used, pcie, bw_util,
                                 cuda_experience, score_variance, model, profiles, engine)
        evidence = load_evidence(results_dir)
        rec = choose(workload, results_dir, evidence)
        report = fit_tree(evidence, load_profiles(profiles), results_dir / "decision_tree") if learn else None
        if html is not None:
            write_page([Path(path) for path in rec.rests_on], html, rec)
    if as_json:
        data = rec.as_json() | ({"learned": report.as_json()} if report else {})
        sys.stdout.write(dumps(data, indent=2) + "\n")
    else:
        print_recommendation(rec, report, explain)


def print_recommendation(rec: Recommendation, report: LearnReport | None, explain: bool) -> None:
    """The choice and why, the alternatives, the path through the evidence and the prior (`explain`), the
    learned tree beside the prior, and the results that could not be read."""
    from specbench.report.recommend_report import (
        alternatives_table,
        explain_nodes,
        learn_lines,
        plain_tree,
        rich_tree,
        summary_lines,
    )

    terminal = out.is_terminal
    for line in summary_lines(rec):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    print_table(alternatives_table(rec, markdown=not terminal))
    if explain:
        nodes = explain_nodes(rec)
        print_table(rich_tree(nodes) if terminal else plain_tree(nodes))
    for line in learn_lines(report) if report else []:
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    for skipped in rec.skipped:
        err.print(f"warning: skipped unreadable {skipped}", style="yellow", highlight=False, markup=False)

