"""The HTML page (`specbench report --html`), opened in a real browser: Debian's chromium, driven by Playwright
for Python through its executable path (Playwright's own browser download is not used). Each page is opened
from disk with every request that is not the file itself refused and recorded; the tests assert no console
error, no request leaving the page, every view present and drawn, and the page's figures equal to the records'.
Without chromium the browser tests are skipped, except in CI (CI=true), where .ci/run installs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
import pytest

from specbench.analysis.stats import summarise_strategies
from specbench.core.records import TunedStudy
from specbench.core.records.serve_records import ServeResult, ServeVerdict
from specbench.report import html_page
from specbench.report.comparison import load_runs
from specbench.report.html_page import Page, render_page, write_page
from specbench.report.html_sweeps import StudyView, TrialValue
from tests.helpers import invoke, record, served, write_run, write_study
from tests.openai_server import OpenAIServer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
RUN_VIEWS = ("headline", "forest", "acceptance", "histogram", "categories", "time", "batch", "provenance", "compare")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file() or importlib.util.find_spec("playwright") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must test the page in a browser: .ci/run installs chromium, the dev extra playwright")
        pytest.skip("no chromium at /usr/bin/chromium, or no playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


@dataclass
class Opened:
    page: object
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def value(self, script: str):
        return self.page.evaluate(script)


def open_page(browser, path: Path) -> Opened:
    """The page at `path` from disk, drawn, every other request refused and recorded."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    opened = Opened(page)
    page.on("console", lambda message: opened.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: opened.errors.append(str(error)))
    url = path.resolve().as_uri()

    def route(request_route):
        if request_route.request.url == url:
            request_route.continue_()
        else:
            opened.refused.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.goto(url)
    page.wait_for_function("document.body.dataset.drawn !== 'no'", timeout=60_000)
    return opened


def run_dir(root: Path, name: str, speedups: dict | None = None, **options) -> Path:
    """A complete run (tests/helpers.py `write_run`) with its summaries per category, as a run writes them."""
    speedups = {"ngram": {"code": 1.2, "chat": 1.1}, "eagle": {"code": 1.6, "chat": 1.3}} if speedups is None \
        else speedups
    path = write_run(root, name, speedups, **options)
    summary = json.loads((path / "summary.json").read_text())
    rows = pd.read_json(path / "rows.jsonl", lines=True)
    summary["by_category"] = [s.as_dict() for s in summarise_strategies(rows, by="category")]
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def serve_result(tmp_path: Path) -> ServeResult:
    answered = [record(i, 0.1, 0.1 + 0.01 * 15, 16) for i in range(8)]
    levels = [served("ar", f"c{c}", c, answered) for c in (1, 4, 16)]
    levels += [served("ngram", f"c{c}", c, answered, tpot_speedup=s, tpot_speedup_ci=[s - 0.1, s + 0.1])
               for c, s in ((1, 1.4), (4, 1.1), (16, 0.8))]
    return ServeResult(tmp_path / "serve-1", levels, {"ngram": ServeVerdict(crossover=16, errors={}, undecided=[])})


def study(tmp_path: Path) -> StudyView:
    """A tuned study's record and trials read back from a SQLite storage, as `report_page` reads them."""
    write_study(tmp_path, "dspark-study", "dspark", 1.8, importances={"dspark.block_size": 1.0})
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuned = optuna.create_study(study_name="dspark-study", storage=storage, direction="maximize")
    for value in (1.2, 1.6, 1.4, 2.1):
        tuned.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=value))
    path = tmp_path / "tuned" / "dspark-study.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"storage": storage}))
    return StudyView(TunedStudy.from_dict(json.loads(path.read_text()), "study"),
                     [TrialValue(n, v) for n, v in enumerate((1.2, 1.6, 1.4, 2.1))])


@pytest.fixture(scope="module")
def full_page(tmp_path_factory) -> tuple[Path, Page]:
    root = tmp_path_factory.mktemp("page")
    runs, notes = load_runs([run_dir(root, "before"), run_dir(root, "after", seed=1,
                                                                modelled={1: {"ngram": 1.2}, 8: {"ngram": 1.05}})])
    page = Page(runs, [serve_result(root)], [study(root)], notes)
    return write_page(page, root / "report.html"), page


def test_a_full_page_opens_offline_with_every_view_drawn(browser, full_page):
    path, page = full_page
    opened = open_page(browser, path)
    assert opened.value("document.body.dataset.drawn") == "yes", opened.value("document.body.innerText")[:500]
    assert opened.errors == [] and opened.refused == []
    sections = opened.value("[...document.querySelectorAll('section')].map(s => s.id)")
    assert sections == [*RUN_VIEWS, "serve", "tune"]
    assert opened.value("document.querySelectorAll('p.empty').length") == 0  # every view has its data here
    drawn = opened.value("""[...document.querySelectorAll('div.figure')].map(d => {
        const svg = d.querySelector('svg.main-svg'), box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
        return [d.id, d.data ? d.data.length : 0, box.width * box.height,
                d.querySelectorAll('.point, .bars path, .hm image, .heatmaplayer image, .scatterlayer path').length];
    })""")
    assert {d[0].split("-figure")[0] for d in drawn} == set(RUN_VIEWS) - {"headline", "provenance", "compare"} | {
        "serve", "tune"}
    for name, traces, area, marks in drawn:
        assert traces > 0 and area > 0 and marks > 0, name


def test_the_figures_on_the_page_are_the_records_own(browser, full_page):
    path, page = full_page
    opened = open_page(browser, path)
    after = page.runs[1]
    forest = opened.value("document.getElementById('forest-figure-0').data.map(t => [t.y[0], t.x[0]])")
    expected = {f"{run.label}/{s.strategy}": 1.0 if s.strategy == "ar" else s.speedup
                for run in page.runs for s in run.summary}
    assert dict(forest) == pytest.approx(expected)
    headline = opened.value("""[...document.querySelectorAll('#headline tbody tr')].map(
        r => [...r.cells].map(c => c.dataset.value))""")
    for row, summary in zip(headline[len(page.runs[0].summary):], after.summary):
        assert row[1] == summary.strategy
        assert float(row[4]) == pytest.approx(summary.tokens_per_s) and float(row[5]) == pytest.approx(summary.tau)
    rates = opened.value("document.getElementById('acceptance-figure-0').data.map(t => [t.name, t.xaxis, [...t.y]])")
    for s in after.summary[1:]:
        assert [r for n, axis, r in rates if n == f"after/{s.strategy}" and axis == "x"] == [
            pytest.approx(s.acceptance_rate_by_position)]
        assert [r for n, axis, r in rates if n == f"after/{s.strategy}" and axis == "x2"] == [
            pytest.approx(s.conditional_acceptance_by_position)]
    serve = "document.getElementById('serve-figure-0').data.filter(t => t.xaxis == '%s').map(t => [t.name, [...t.y]])"
    ngram = page.serves[0].levels[3:]
    assert dict(opened.value(serve % "x2"))["ngram"] == pytest.approx([e.tpot_ms.p50 for e in ngram])
    assert dict(opened.value(serve % "x3"))["ngram"] == pytest.approx([1.4, 1.1, 0.8])
    trials = opened.value("document.getElementById('tune-figure-0').data[0].y")
    assert trials == pytest.approx([1.2, 1.6, 1.4, 2.1])
    assert "ngram stops paying at concurrency 16" in opened.value("document.getElementById('serve').innerText")


def test_sorting_the_headline_by_a_column(browser, full_page):
    opened = open_page(browser, full_page[0])
    speedups = "[...document.querySelectorAll('#headline tbody tr')].map(r => +r.cells[3].dataset.value)"
    shown = opened.value(speedups)
    assert shown == [1.0 if s.strategy == "ar" else s.speedup for run in full_page[1].runs for s in run.summary]
    opened.page.click("#headline th:nth-child(4)")  # speedup, ascending
    assert opened.value(speedups) == sorted(shown) != shown
    opened.page.click("#headline th:nth-child(4)")
    assert opened.value(speedups) == sorted(shown, reverse=True)


def test_a_one_strategy_one_prompt_run_renders_its_empty_views_saying_why(browser, tmp_path):
    run = write_run(tmp_path, "ar-only", {}, categories=("code",), prompts=1)
    (run / "run.json").write_text((run / "run.json").read_text().replace('"complete"', '"incomplete"'))
    (run / "summary.json").unlink()
    assert invoke("report", run, "--html", tmp_path / "page.html").exit_code == 0
    opened = open_page(browser, tmp_path / "page.html")
    assert opened.value("document.body.dataset.drawn") == "yes" and opened.errors == [] and opened.refused == []
    empty = opened.value("[...document.querySelectorAll('p.empty')].map(p => p.closest('section').id + ': ' + "
                         "p.innerText)")
    assert [e.split(":")[0] for e in empty] == ["acceptance", "histogram", "categories", "batch", "compare"]
    assert all("Not shown: " in e and len(e.split("Not shown: ")[1]) > 20 for e in empty)
    assert "is incomplete" in opened.value("document.body.innerText")  # what the page tells of the run


def test_a_serve_run_reads_back_from_its_directory_into_the_page(browser, tiny_model_dir, tmp_path, monkeypatch):
    """What `serve --html` and `report SERVE_DIR --html` read is the directory a real sweep wrote: the page's TPOT
    per level is its summary.json's."""
    from transformers import AutoTokenizer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIServer(AutoTokenizer.from_pretrained(tiny_model_dir)) as server:
        # a process of its own, as a user runs it: Playwright's sync API holds this thread's event loop
        result = subprocess.run([sys.executable, "-m", "specbench", "serve", "--endpoint", f"ar={server.url}",
                                 "--endpoint", f"ngram={server.url}", "--tokenizer", str(tiny_model_dir),
                                 "--concurrency", "1,2", "--requests", "4", "--warmup", "1", "--output-len", "8",
                                 "--out", str(tmp_path), "--html"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    run = next((tmp_path / "serve").glob("*"))
    assert (run / "report.html").is_file()
    assert invoke("report", run, "--html", tmp_path / "page.html").exit_code == 0
    opened = open_page(browser, tmp_path / "page.html")
    assert opened.value("document.body.dataset.drawn") == "yes" and opened.errors == [] and opened.refused == []
    tpot = dict(opened.value("document.getElementById('serve-figure-0').data.filter(t => t.xaxis == 'x2')"
                             ".map(t => [t.name, [...t.y]])"))
    levels = json.loads((run / "summary.json").read_text())["levels"]
    for strategy in ("ar", "ngram"):
        assert tpot[strategy] == pytest.approx([e["tpot_ms"]["p50"] for e in levels if e["strategy"] == strategy])


def test_a_13_strategy_run_with_a_serve_sweep_and_a_study_is_a_page_to_mail(tmp_path):
    speedups = {f"s{i}": 1.0 + 0.1 * i for i in range(12)}
    run = run_dir(tmp_path, "big", speedups, categories=("code", "chat", "math", "writing"), prompts=20)
    runs, notes = load_runs([run])
    text = render_page(Page(runs, [serve_result(tmp_path)], [study(tmp_path)], notes))
    assert len(text.encode()) < 5_000_000
    assert text.count("plotly-gzip") == 2 and text.count("class=\"figure-data\"") == 7  # plotly.js inlined once


def test_the_page_carries_the_cartesian_bundle_of_the_plotly_js_its_figures_are_made_for(tmp_path, monkeypatch):
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    assert f"(cartesian - minified) v{get_plotlyjs_version()}\n" in html_page.plotly_js()[:200]
    other = tmp_path / "plotly-cartesian.min.js"
    other.write_text("/**\n* plotly.js (cartesian - minified) v0.0.1\n*/\n")
    monkeypatch.setattr(html_page, "CARTESIAN", other)
    assert html_page.plotly_js() == get_plotlyjs()  # another version: plotly.py's own full bundle


def test_the_page_of_runs_of_different_models_leaves_the_comparison_out_and_says_why(tmp_path):
    runs = [run_dir(tmp_path, "a"), run_dir(tmp_path, "b", model="other")]
    result = invoke("report", *runs, "--html", tmp_path / "page.html", "--format", "csv")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "page.html").read_text()
    assert "Not shown: left out: a and b differ in model" in text and "the runs differ in model or settings" in text


@pytest.mark.parametrize("where, needle", [
    ("missing/page.html", "does not exist"), ("", "is a directory"), ("/proc/page.html", "does not take new files")])
def test_a_page_that_cannot_be_written_is_one_line_and_nothing_left(tmp_path, where, needle):
    run = run_dir(tmp_path, "a")
    result = invoke("report", run, "--html", tmp_path / where)  # an absolute `where` replaces tmp_path
    assert result.exit_code == 2 and needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.html")) and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("damage, needle", [
    ("not-a-run", "not a specbench run directory"),
    ("old-schema", "'status' must be one of"),
    ("study.json", "the entries of tuned study"),
])
def test_not_a_run_an_older_schema_or_not_a_study_is_one_line(tmp_path, damage, needle):
    path = tmp_path / damage
    if damage == "study.json":
        path.write_text(json.dumps({"study": "s"}))
    else:
        path.mkdir()
    if damage == "old-schema":
        (path / "run.json").write_text(json.dumps({"model": "m", "strategies": ["ar"]}))
    result = invoke("report", path, "--html", tmp_path / "page.html")
    assert result.exit_code == 2 and needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "page.html").exists()


def test_run_and_tune_write_their_page_beside_the_results(tmp_path, monkeypatch):
    import specbench
    from specbench.report.run_dir import read_run
    from specbench.tuning.trials import TuneReport

    run = run_dir(tmp_path, "a")
    monkeypatch.setattr(specbench, "run", lambda *args, **settings: read_run(run))
    result = invoke("run", "--html", "--limit", "1")
    assert result.exit_code == 0, result.output
    assert f"page: {run / 'report.html'}" in result.output and "id=\"forest\"" in (run / "report.html").read_text()

    record = study(tmp_path).record
    record.toml = str(tmp_path / "tuned" / "dspark-study.toml")
    monkeypatch.setattr(specbench, "tune", lambda *args, **settings: TuneReport([record], []))
    assert invoke("tune", "--html", "--strategy", "dspark").exit_code == 0
    assert "trials in order" in (tmp_path / "tuned" / "dspark-study.html").read_text()


def test_recommend_writes_its_decision_and_the_runs_it_rests_on(browser, tmp_path):
    write_run(tmp_path, "cpu-run", {"ngram": 1.2, "dflash": 1.6}, categories=("code",))
    result = invoke("recommend", "--results", tmp_path, "--gpu", "cpu", "--html", tmp_path / "page.html")
    assert result.exit_code == 0, result.output
    opened = open_page(browser, tmp_path / "page.html")
    assert opened.value("document.body.dataset.drawn") == "yes" and opened.errors == [] and opened.refused == []
    text = opened.value("document.getElementById('recommendation').innerText")
    assert "recommend: dflash (measured)" in text and "the decision" in text and "ngram" in text
    evidence = opened.value("document.getElementById('recommendation-figure-0').data.map(t => [t.y[0], t.x[0]])")
    assert dict(evidence) == pytest.approx({"dflash (measured)": 1.6, "ngram (measured)": 1.2, "ar (measured)": 1.0},
                                           rel=0.05)
    sections = opened.value("[...document.querySelectorAll('section')].map(s => s.id)")
    assert sections == ["recommendation", *RUN_VIEWS]  # the run it rests on, beside it
