"""Bad input, table-driven: each case exits with code 2 and one line on stderr, no traceback, nothing written.

Every case is refused before torch is imported (checked in a fresh interpreter) and before any
model loads; run directories given to --resume are left byte for byte as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import huggingface_hub.constants
import pytest
import typer
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core.ranges import RANGES
from tests.helpers import invoke

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]  # subprocesses import this checkout, whatever is installed


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished")
    result = invoke("run", "--model", tiny_model_dir, "--strategy", "ngram", "--limit", 1, "--max-new-tokens", 4,
                    "--warmup", 0, "--out", out, "--json")
    assert result.exit_code == 0, result.output
    return Path(json.loads(result.stdout)["run_dir"])


class Workspace:
    """A scratch directory (also the working directory) holding copies of a finished run."""

    def __init__(self, root: Path, finished_run: Path, tiny_model_dir: Path):
        self.root = root
        self.model = tiny_model_dir
        self.complete = root / "complete"
        shutil.copytree(finished_run, self.complete)
        self.incomplete = root / "incomplete"
        shutil.copytree(finished_run, self.incomplete)
        meta = json.loads((self.incomplete / "run.json").read_text())
        (self.incomplete / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))
        self.prompts = self.write("train.jsonl", '{"prompt": "def f(x): return"}\n')

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return path

    def damaged(self, name: str, content: str) -> Path:
        """A copy of the incomplete run whose `name` holds `content`."""
        path = Path(tempfile.mkdtemp(prefix=f"damaged-{name}-", dir=self.root))
        shutil.copytree(self.incomplete, path, dirs_exist_ok=True)
        (path / name).write_text(content)
        return path

    def drafter(self, strategy: str) -> Path:
        return self.write(f"drafters/{strategy}/config.json", json.dumps({"specbench_strategy": strategy})).parent

    def snapshot(self) -> dict[str, bytes | None]:
        return {str(p.relative_to(self.root)): p.read_bytes() if p.is_file() else None
                for p in sorted(self.root.rglob("*"))}


def unwritable_dir(w: Workspace) -> Path:
    path = w.root / "locked"
    path.mkdir(exist_ok=True)
    path.chmod(0o500)
    return path


def toml(w: Workspace, text: str | bytes) -> list:
    path = Path(tempfile.mkstemp(suffix=".toml", dir=w.root)[1])
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return ["run", "--config", path]


# (case, arguments given the workspace, what the one line must say)
CASES = [
    ("empty strategy", lambda w: ["run", "--strategy", ""], "names no strategy"),
    ("knob for a strategy not run", lambda w: ["run", "--strategy", "ngram", "--set", "draft.k=4"],
     "draft.k is for draft, which this run does not include"),
    ("resume with another --max-new-tokens", lambda w: ["run", "--resume", w.incomplete, "--max-new-tokens", 8],
     "--max-new-tokens 8 (the run has 4) would change"),
    ("resume with another --strategy", lambda w: ["run", "--resume", w.incomplete, "--strategy", "draft"],
     "--strategy draft (the run has ngram)"),
    ("resume with another knob", lambda w: ["run", "--resume", w.incomplete, "--set", "ngram.max_ngram=2"],
     "--set ngram.max_ngram=2"),
    ("TOML strategy a number", lambda w: toml(w, "strategy = 5\n"), "strategy must be a string or a list of strings"),
    ("TOML knobs not a table", lambda w: toml(w, "knobs = 3\n"), "knobs must be a table, got 3"),
    ("TOML knob table not a table", lambda w: toml(w, "[knobs]\nngram = 3\n"), "knobs.ngram must be a table"),
    ("TOML max_new_tokens a string", lambda w: toml(w, 'max_new_tokens = "abc"\n'),
     "max_new_tokens must be an integer, got 'abc'"),
    ("TOML temperature infinite", lambda w: toml(w, "temperature = inf\n"), "temperature must be a finite number"),
    ("binary config file", lambda w: toml(w, bytes(range(256))), "is not a TOML text file"),
    ("resume: run.json not JSON", lambda w: ["run", "--resume", w.damaged("run.json", '{"status": ')],
     "run.json is not valid JSON"),
    ("resume: run.json without status", lambda w: ["run", "--resume", w.damaged("run.json", "[]")],
     "run.json must hold a JSON object"),
    ("resume: config.json not JSON", lambda w: ["run", "--resume", w.damaged("config.json", "\x00\x01")],
     "config.json is not valid JSON"),
    ("resume: config.json unknown key", lambda w: ["run", "--resume", w.damaged("config.json", '{"nope": 1}')],
     "config.json is damaged: unknown key(s) nope"),
    ("resume: config.json wrong type", lambda w: ["run", "--resume",
                                                  w.damaged("config.json", '{"max_new_tokens": "abc"}')],
     "config.json: max_new_tokens must be an integer"),
    ("resume: not a run directory", lambda w: ["run", "--resume", w.root], "not a specbench run directory"),
    ("resume a complete run", lambda w: ["run", "--resume", w.complete], "is complete: there is nothing to resume"),
    ("--out a file", lambda w: ["run", "--out", w.write("taken", "x")], "is a file, not a directory"),
    ("--out inside a file", lambda w: ["run", "--out", w.write("taken", "x") / "results"], "which is a file"),
    ("--out an unwritable directory", lambda w: ["run", "--out", unwritable_dir(w)], "does not take new files"),
    ("--out /proc", lambda w: ["run", "--out", "/proc"], "--out /proc"),
    ("--out under /proc", lambda w: ["run", "--out", "/proc/specbench/results"], "does not take new files"),
    ("--limit abc", lambda w: ["run", "--limit", "abc"], "'--limit'"),
    ("unknown option", lambda w: ["run", "--limt", "2"], "--limt"),
    ("--model not available offline", lambda w: ["run", "--model", "gpt2"],
     "model gpt2 is not available offline"),
    ("--controller unknown", lambda w: ["run", "--controller", "nope"], "fixed, heuristic, entropy, dspark"),
    # how a combination combines (methods/combine_options.py)
    ("a method combined with itself", lambda w: ["run", "--strategy", "eagle+eagle"], "cannot repeat a member"),
    ("combine knob without a combination", lambda w: ["run", "--strategy", "eagle", "--set", "combine.mode=route"],
     "combine.mode is for a combination, which this run does not include"),
    ("a combination the engine lacks", lambda w: ["run", "--engine", "vllm", "--strategy", "eagle+suffix"],
     "combinations run with --engine specbench"),
    ("--dtype unknown", lambda w: ["run", "--dtype", "int8"], "--dtype int8"),
    ("report --out a directory", lambda w: ["report", w.complete, "--out", w.root], "is a directory"),
    ("train --out a file", lambda w: ["train", "--strategy", "eagle", "--prompts", w.prompts,
                                      "--out", w.write("taken", "x"), "--model", w.model], "is a file"),
    ("train --out holding another drafter", lambda w: ["train", "--strategy", "eagle", "--prompts", w.prompts,
                                                       "--out", w.drafter("mtp"), "--model", w.model],
     "holds a mtp drafter; training eagle would replace it"),
    ("train --out holding other files", lambda w: ["train", "--strategy", "eagle", "--prompts", w.prompts,
                                                   "--out", w.write("mine/notes.txt", "x").parent],
     "not a specbench drafter"),
    # tune: the study settings, its storage, and a selection too small to hold prompts out
    ("tune --strategy nope", lambda w: ["tune", "--strategy", "nope"], "unknown strategy"),
    ("tune the baseline", lambda w: ["tune", "--strategy", "ar"], "the baseline has no knobs to tune"),
    ("tune --gpu unknown", lambda w: ["tune", "--gpu", "nope"], "unknown GPU profile"),
    ("tune --objectives unknown", lambda w: ["tune", "--objectives", "latency"], "unknown --objectives"),
    ("tune --storage unknown dialect", lambda w: ["tune", "--storage", "nosuchdialect://x/y"], "cannot open storage"),
    ("tune --storage unreachable server", lambda w: ["tune", "--storage",
                                                     "postgresql+psycopg://someone:secret@127.0.0.1:1/none"],
     "cannot open storage postgresql+psycopg://someone:***@127.0.0.1:1/none"),  # the password is hidden
    ("tune --storage in no directory", lambda w: ["tune", "--storage", "/no/such/dir/journal.log"],
     "cannot open storage /no/such/dir/journal.log"),
    ("tune --study with a slash", lambda w: ["tune", "--study", "a/b"], "--study 'a/b'"),
    ("tune --trials fewer than strategies", lambda w: ["tune", "--trials", 3], "cannot be split between 4"),
    ("tune one prompt", lambda w: ["tune", "--strategy", "dspark", "--trials", 2, "--limit", 1],
     "--holdout needs at least 2 prompts to split, the selection has 1"),
    # recommend: what is not a range
    ("recommend --gpu unknown", lambda w: ["recommend", "--gpu", "nope"],
     "unknown GPU profile 'nope'; known: a100-40g"),
    ("recommend --task unknown", lambda w: ["recommend", "--gpu", "cpu", "--task", "poetry"],
     "unknown task 'poetry'; valid: chat, code"),
    ("recommend --vram-used beyond the GPU", lambda w: ["recommend", "--gpu", "rtx4090", "--vram-used", 30],
     "exceeds the 24 GB of rtx4090"),
    ("recommend --cuda-experience unknown", lambda w: ["recommend", "--gpu", "cpu", "--cuda-experience", "lots"],
     "--cuda-experience must be one of none, some, expert"),
    ("recommend --results missing", lambda w: ["recommend", "--gpu", "cpu", "--results", "/nonexistent/results"],
     "results directory /nonexistent/results does not exist"),
    ("costs --dtype unknown", lambda w: ["costs", "--dtype", "int8"], "--dtype int8"),
    ("costs --verify-lengths unsorted", lambda w: ["costs", "--verify-lengths", "4,2"], "increasing order"),
    ("costs --out a file", lambda w: ["costs", "--out", w.write("taken", "x")], "is a file, not a directory"),
]
# Every numeric option of these commands is checked against its range in specbench/core/ranges.py: one case
# below and one above each bound (the bound itself where it is open), and NaN for a float (which run's and
# tune's type check of the whole configuration refuses first).
COMMANDS = {
    "run": lambda w: ["run"],
    "serve": lambda w: ["serve"],
    "tune": lambda w: ["tune"],
    "recommend": lambda w: ["recommend", "--gpu", "rtx4090"],
    "costs": lambda w: ["costs"],
    "convert": lambda w: ["convert", w.complete, "--out", w.root / "converted"],
    "train": lambda w: ["train", "--strategy", "eagle", "--prompts", w.prompts, "--out", w.root / "d"],
    "prepare": lambda w: ["prepare", "smollm2-135m"],
}


def numeric_options(command: str) -> list[tuple[str, bool]]:
    """(flag, takes a float) for every int or float option of `command`."""
    params = typer.main.get_command(app).commands[command].params
    types = [(p.opts[0], getattr(p, "type_descriptor", None)) for p in params if p.param_type_name == "option"]
    return [(flag, kind.annotation is float) for flag, kind in types if kind and kind.annotation in (int, float)]


def outside(option: str, is_float: bool) -> list:
    bounds = RANGES[option]
    values = []
    if bounds.low is not None:
        values.append(bounds.low if bounds.open_low else bounds.low - 1)
    if bounds.high is not None:
        values.append(bounds.high if bounds.open_high else bounds.high + 1)
    return [v if is_float else int(v) for v in values] + (["nan"] if is_float else [])


RANGE_CASES = [(f"{command} {option} {value}", lambda w, b=base, o=option, v=value: [*b(w), o, v],
                "must be" if value == "nan" else f"{option} must be ")
               for command, base in COMMANDS.items() for option, is_float in numeric_options(command)
               for value in outside(option, is_float)]
CASES += RANGE_CASES


def test_every_numeric_option_has_a_range():
    assert {option for command in COMMANDS for option, _ in numeric_options(command)} == set(RANGES)
    assert "recommend --bw-util 2" in [case for case, _, _ in RANGE_CASES]  # a utilisation is a fraction


# knob values are checked by the method modules (torch), still before any model loads
AFTER_TORCH = [
    ("TOML knob of the wrong type", lambda w: toml(w, 'strategy = "ngram"\n[knobs.ngram]\nmax_ngram = [1]\n'),
     "ngram.max_ngram: expected int"),
    ("--set knob unknown", lambda w: ["run", "--strategy", "ngram", "--set", "ngram.nope=1"], "valid: ngram.max_ngram"),
    # how a combination combines: its knobs' values, checked with the others'
    ("combine mode unknown", lambda w: ["run", "--strategy", "eagle+suffix", "--set", "combine.mode=all"],
     "combine.mode must be one of union, budget, route, got 'all'"),
    ("combine router unknown", lambda w: ["run", "--strategy", "eagle+suffix", "--set", "combine.router=x"],
     "combine.router must be one of cost, entropy"),
    ("combine budget below one node", lambda w: ["run", "--strategy", "eagle+suffix", "--set", "combine.budget=-1"],
     "combine.budget must be at least 1 node"),
    ("combine thresholds inverting the hysteresis",
     lambda w: ["run", "--strategy", "eagle+suffix", "--set", "combine.entropy_low=3",
                "--set", "combine.entropy_high=1"],
     "the hysteresis would be inverted"),
    ("train --strategy not trainable", lambda w: ["train", "--strategy", "ngram", "--prompts", w.prompts,
                                                  "--out", w.root / "d"], "cannot be trained"),
]


@pytest.fixture
def workspace(tmp_path, finished_run, tiny_model_dir, monkeypatch) -> Workspace:
    monkeypatch.chdir(tmp_path)  # the default --out (results/) would land here
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # gpt2 never cached
    return Workspace(tmp_path, finished_run, tiny_model_dir)


@pytest.mark.parametrize("case, make_args, message", CASES + AFTER_TORCH, ids=[c[0] for c in CASES + AFTER_TORCH])
def test_bad_input_is_one_line_exit_2_nothing_written(case, make_args, message, workspace):
    args = make_args(workspace)
    if case == "--out an unwritable directory" and os.access(args[-1], os.W_OK):
        pytest.skip("running as root: permission bits do not stop writes (the /proc cases cover it)")
    before = workspace.snapshot()
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
    assert workspace.snapshot() == before


def test_every_case_is_refused_before_torch_is_imported(workspace, tmp_path):
    """The same cases in a fresh interpreter: none of them imports torch (which takes seconds)."""
    cases = [[str(a) for a in make_args(workspace)] for _, make_args, _ in CASES]
    cases = [args for args in cases if not (args[-1].endswith("locked") and os.access(args[-1], os.W_OK))]
    script = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from specbench.cli import app\n"
        "runner = CliRunner()\n"
        "codes = [runner.invoke(app, args).exit_code for args in json.loads(sys.argv[1])]\n"
        "print(json.dumps({'codes': codes, 'torch': 'torch' in sys.modules}))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["torch"] is False
    assert set(report["codes"]) == {2}
