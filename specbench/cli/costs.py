"""`specbench costs`: measure (or reuse) the forward-cost table of a target and its drafters."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from specbench.cli import options
from specbench.cli.app import app, err, out, print_table, progress_bar, size_list, split_list, user_errors


@app.command()
def costs(
    model: options.Model = None,
    drafter: options.Drafters = None,
    strategy: Annotated[Optional[list[str]], typer.Option("--strategy", "-s", help="Time only these drafters (comma list; default: every drafter the model has).")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(help="Batch sizes, increasing (default 1,2,4,8,16,32).")] = None,
    verify_lengths: Annotated[Optional[str], typer.Option(help="Tokens per verify forward, increasing (default 1,2,4,8,16).")] = None,
    context_lens: Annotated[Optional[str], typer.Option(help="Cached context lengths, increasing (default 128,1024).")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed repeats per entry (the median is kept; default 5).")] = None,
    dtype: options.Dtype = None,
    device: options.Device = None,
    out_dir: options.ResultsDir = None,
    as_json: options.Json = False,
) -> None:
    """Time target forwards by batch size, verify length and context, and each drafter's proposal.

    Entries already stored for this model, device, dtype and torch version are reused, not timed again.
    """
    from dataclasses import replace

    from specbench.analysis.cost_table import BATCH_GRID
    from specbench.core.paths import check_output_dir
    from specbench.core.ranges import check_device, check_dtype

    defaults = options.DEFAULTS
    dtype, device, out_dir = dtype or defaults.dtype, device or defaults.device, out_dir or defaults.out
    with user_errors():
        # every check that needs no torch comes first: a bad input is refused at once
        grid = replace(BATCH_GRID, **{k: v for k, v in {
            "batch_sizes": size_list(batch_sizes, "--batch-sizes"),
            "verify_lengths": size_list(verify_lengths, "--verify-lengths"),
            "context_lens": size_list(context_lens, "--context-lens"),
            "repeats": repeats}.items() if v is not None})
        grid.check()
        check_dtype(dtype)
        check_device(device)
        check_output_dir(out_dir, "--out")

        from specbench.bench.cost_timing import measure_target_costs
        from specbench.core.strict_json import dumps
        from specbench.decoding.target import load_target, resolve_device, resolve_dtype
        from specbench.report.batch_tables import cost_frames, render_frame

        torch_device = resolve_device(device)
        target = load_target(model, torch_device, resolve_dtype(dtype, torch_device))
        if context_lens is None:
            grid = grid.within(getattr(target.model.config, "max_position_embeddings", None))
        with progress_bar() as bar:
            task = bar.add_task("costs", total=None, detail="")

            def advance(what: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, detail=what)

            table, path = measure_target_costs(target, list(drafter or []), out_dir, grid, split_list(strategy), advance)
    if as_json:
        sys.stdout.write(dumps({"path": str(path), **table.as_json()}, indent=2) + "\n")
        return
    for title, frame in cost_frames(table).items():
        print_table(render_frame(frame, title, markdown=not out.is_terminal))
    err.print(f"cost table: {path}", highlight=False)
