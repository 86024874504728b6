"""What a newcomer finds: help on every option, every default of `run`, `python -m specbench`, an ETA,
quiet model loading, hub ids from the local cache only, and run directories that cannot be confused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import typer
from rich.progress import TimeRemainingColumn

from specbench.cli import app
from specbench.cli.app import progress_bar
from specbench.config import RunConfig, resolve
from specbench.errors import SpecbenchError
from specbench.model_source import model_path
from specbench.models import load_target
from specbench.output.run_dir import RunDir, run_name
from specbench.strategies.controllers import CONTROLLERS

REPO = Path(__file__).resolve().parents[1]
COMMANDS = typer.main.get_command(app).commands


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help(name):
    missing = [p.name for p in COMMANDS[name].params if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"specbench {name}: no help for {missing}"


def test_run_help_shows_every_default():
    run = COMMANDS["run"]
    hidden = [p.name for p in run.params if not getattr(p, "is_flag", False)
              and not isinstance(p.show_default, str) and p.default is None]
    assert not hidden
    assert all(name in next(p.help for p in run.params if p.name == "controller") for name in CONTROLLERS)


def test_python_dash_m_specbench():
    done = subprocess.run([sys.executable, "-m", "specbench", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("specbench "), done.stderr


def test_progress_bar_shows_the_time_remaining_and_nothing_off_a_terminal():
    bar = progress_bar()
    assert any(isinstance(column, TimeRemainingColumn) for column in bar.columns)
    assert bar.disable  # stderr is not a terminal here: no bar, and no blank line where it was


def test_loading_a_model_prints_nothing(tiny_model_dir, capfd):
    load_target(str(tiny_model_dir), torch.device("cpu"), torch.float32)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_hub_id_is_read_from_the_local_cache_only(tiny_model_dir, tmp_path):
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_model_dir, snapshot)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    assert model_path("org/tiny", cache_dir=tmp_path) == str(snapshot)
    (snapshot / "config.json").unlink()
    with pytest.raises(SpecbenchError, match="interrupted download"):
        model_path("org/tiny", cache_dir=tmp_path)
    with pytest.raises(SpecbenchError, match="not available offline.*hf download org/other"):
        model_path("org/other", cache_dir=tmp_path)


def test_run_names_tell_runs_apart():
    config = RunConfig(strategies=["ngram", "draft", "eagle", "mtp"])
    strategies = ["ar", "ngram", "draft", "eagle", "mtp"]
    name = run_name(config, strategies)
    assert "-ngram-draft-eagle-and-1-more-" in name
    assert run_name(config, strategies)[-6:] == name[-6:]  # the same run, the same hash
    assert run_name(config, strategies[:-1] + ["dflash"])[-6:] != name[-6:]
    assert run_name(replace(config, max_new_tokens=32), strategies)[-6:] != name[-6:]
    assert run_name(replace(config, out="elsewhere"), strategies)[-6:] == name[-6:]


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    monkeypatch.setattr("specbench.output.run_dir.environment", dict)
    config = RunConfig(strategies=["ngram"])
    first = RunDir.create(tmp_path, config, "m", "s", ["ar", "ngram"])
    monkeypatch.setattr("specbench.output.run_dir.run_name", lambda *args: first.path.name)
    second = RunDir.create(tmp_path, config, "m", "s", ["ar", "ngram"])
    assert second.path != first.path and second.path.name == first.path.name + "-2"


def test_resume_accepts_the_flags_it_was_started_with():
    saved = RunConfig(strategies=["ngram", "draft"], max_new_tokens=8, knobs={"draft": {"k": 4}})
    flags = {"strategies": ["ngram,draft"], "max_new_tokens": 8, "knobs": {"draft": {"k": "4"}}, "limit": None}
    assert resolve({}, flags, saved) == saved.validate()


def test_the_readme_test_command_runs_what_ci_runs():
    """CI installs what the README's test command installs and runs the same pytest, and that install
    carries every driver the tests use (the PostgreSQL tune tests fail rather than skip without it)."""
    command = next(line.strip() for line in (REPO / "README.md").read_text().splitlines()
                   if line.strip().startswith("pip install -e") and line.strip().endswith("&& pytest"))
    install, *between = [step.strip() for step in command.removesuffix("&& pytest").split("&&") if step.strip()]
    install = install.removeprefix("pip install -e ")
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-e " + re.escape(install) + "$", ci, re.M), ci
    for step in between:  # e.g. the uninstall of what does not load: CI does the same
        program, verb, *args = step.split()
        assert re.search(rf"{program} {verb} .*{re.escape(' '.join(args))}$", ci, re.M), (step, ci)
    assert ci.rstrip().splitlines()[-1] == "python3 -m pytest"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def requirements(names: list[str]) -> list[str]:
        """The extras' requirements, an extra that names specbench's own extras expanded."""
        found = []
        for req in (req for name in names for req in extras[name]):
            own = re.fullmatch(r"specbench\[(.*)\]", req)
            found += requirements(own.group(1).split(",")) if own else [req]
        return found

    needs = requirements(re.fullmatch(r'"\.\[(.*)\]"', install).group(1).split(","))
    assert any(req.startswith("psycopg") for req in needs), needs
