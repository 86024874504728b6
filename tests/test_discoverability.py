"""What a newcomer finds: help on every option, every default of `run`, `python -m specbench`, an ETA,
quiet model loading, hub ids from the local cache only, and run directories that cannot be confused."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import FrozenInstanceError, replace
from importlib import metadata
from pathlib import Path

import pytest
import torch
import typer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from rich.progress import TimeRemainingColumn

from specbench.cli import app
from specbench.cli.app import progress_bar
from specbench.core.errors import SpecbenchError
from specbench.core.records import Environment
from specbench.decoding.model_source import model_path
from specbench.decoding.target import load_target
from specbench.methods.controllers import CONTROLLERS
from specbench.plan.run_config import RunConfig, resolve
from specbench.report.run_dir import RunDir, run_name

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
    monkeypatch.setattr("specbench.report.run_dir.environment", lambda drafters: Environment())
    config = RunConfig(strategies=["ngram"])
    first = RunDir.create(tmp_path, config, "m", "s", ["ar", "ngram"])
    monkeypatch.setattr("specbench.report.run_dir.run_name", lambda *args: first.path.name)
    second = RunDir.create(tmp_path, config, "m", "s", ["ar", "ngram"])
    assert second.path != first.path and second.path.name == first.path.name + "-2"


def test_resume_accepts_the_flags_it_was_started_with():
    saved = RunConfig(strategies=["ngram", "draft"], max_new_tokens=8, knobs={"draft": {"k": 4}})
    flags = {"strategies": ["ngram,draft"], "max_new_tokens": 8, "knobs": {"draft": {"k": "4"}}, "limit": None}
    assert resolve({}, flags, saved).config == saved.validate()


def dev_install() -> set[str]:
    """The distributions `pip install -e ".[dev]"` puts in this environment: the dev extra and specbench's
    dependencies, then what each installed one requires in turn (environment markers evaluated here)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pending = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    found: set[str] = set()
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if name == "specbench":
            pending += [Requirement(r) for extra in req.extras for r in project["optional-dependencies"][extra]]
            continue
        if name in found or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # declared for another platform, or not installed here
            continue
        for text in requires:
            sub = Requirement(text)
            if not sub.marker or any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                pending.append(sub)
    return found


def test_a_plan_is_frozen_and_leaves_its_configuration_as_it_was():
    """Resolving reads each input once into the plan; the configuration planned is not changed (0 for the whole
    suite and a draft schedule's spelling are normalised in the plan's checked copy only)."""
    schedule = {"batch_sizes": [1, 4], "draft_tokens": [3, 0]}
    config = RunConfig(strategies=["ngram"], limit=0, draft_schedule={"NGRAM": schedule})
    plan = config.plan()
    assert (config.limit, list(config.draft_schedule)) == (0, ["NGRAM"])
    assert (plan.config.limit, list(plan.config.draft_schedule)) == (None, ["ngram"])
    assert [s.name for s in plan.strategies] == ["ar", "ngram"] and plan.engines == ("specbench",)
    with pytest.raises(FrozenInstanceError):
        plan.suite = None


def test_the_dev_extra_installs_every_package_the_tests_import():
    """The test command's install (`pip install -e ".[dev]"`, what CI runs) carries every package a test imports,
    the PostgreSQL driver of the distributed tune tests and vLLM among them: they fail rather than skip in CI."""
    modules = set()
    for path in (REPO / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"__future__", "specbench", "tests"}
    assert {"psycopg", "vllm", "pytest"} <= modules, modules
    installed, providers = dev_install(), metadata.packages_distributions()
    missing = {}
    for module in sorted(modules):
        if module not in providers:  # absent here: its tests skip, except in CI, which installs the dev extra
            if os.environ.get("CI"):
                missing[module] = "not installed"
        elif not {canonicalize_name(d) for d in providers[module]} & installed:
            missing[module] = providers[module]
    assert not missing, f"imported by the tests but not installed by the dev extra: {missing}"
