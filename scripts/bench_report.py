"""The HTML report's targets (issue 49), measured: one page of real runs, a serve sweep and a tune study, its
size, and how long headless Chromium takes to draw it.

The page is written as `specbench report PATHS --html` writes it, then opened --loads times from disk in
Debian's chromium (through Playwright, every request but the file's own refused and counted); each load is
timed from navigation until the page marks itself drawn (`data-drawn="yes"` on its body, set once every
figure is drawn). The target: <= 5 MB, < 2 s, no request leaving the page, no console error. With
--screenshot FILE the top of the page is saved as a PNG (the README's picture).

Writes results/benchmarks/NAME.{json,md} (default report).

    python scripts/bench_report.py results/runs/RUN results/serve/SERVE results/tuned/STUDY.json \\
        --screenshot docs/report.png
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import specbench
from specbench.core.files import write_atomic, write_json

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def time_loads(path: Path, loads: int, screenshot: Path | None) -> dict:
    """Seconds from navigation to drawn, per load, with what left the page and what the console said."""
    from playwright.sync_api import sync_playwright

    url = path.resolve().as_uri()
    seconds, refused, errors = [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(loads):
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.route("**/*", lambda route: route.continue_() if route.request.url == url
                       else (refused.append(route.request.url), route.abort()))
            start = time.perf_counter()
            page.goto(url)
            page.wait_for_function("document.body.dataset.drawn !== 'no'", timeout=60_000, polling=10)
            seconds.append(time.perf_counter() - start)
            drawn = page.evaluate("document.body.dataset.drawn")
            if screenshot and len(seconds) == 1:
                page.screenshot(path=str(screenshot))
            page.close()
        browser.close()
    return {"seconds": seconds, "median_s": statistics.median(seconds), "drawn": drawn,
            "requests_refused": refused, "console_errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="runs, serve runs and tune studies, as `specbench report` takes them")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--name", default="report")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        html = Path(work) / "report.html"
        page = specbench.report_page(args.paths, html)
        size = html.stat().st_size
        timing = time_loads(html, args.loads, args.screenshot)
    result = {"paths": args.paths, "runs": len(page.runs), "serve_runs": len(page.serves), "studies": len(page.studies),
              "strategies": sorted({row.strategy for run in page.runs for row in run.summary}),
              "bytes": size, **timing}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{args.name}.json", result)
    loads = ", ".join(f"{s:.2f}" for s in timing["seconds"])
    lines = ["# The HTML report: size and time to draw", "",
             f"`python scripts/bench_report.py {' '.join(args.paths)}` (headless Debian chromium, {args.loads} loads)",
             "", f"- {result['runs']} run(s) of {len(result['strategies'])} strategies (ar included), "
             f"{result['serve_runs']} serve run(s), {result['studies']} tune study(ies)",
             f"- page: {size / 1e6:.2f} MB (target <= 5 MB)",
             f"- navigation to drawn: {loads} s; median {timing['median_s']:.2f} s (target < 2 s); "
             f"the page says drawn: {timing['drawn']}",
             f"- requests leaving the page: {len(timing['requests_refused'])}; console errors: "
             f"{len(timing['console_errors'])}", ""]
    write_atomic(args.out / f"{args.name}.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
