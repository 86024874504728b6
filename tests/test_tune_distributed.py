"""Tune workers on a real PostgreSQL server: a throw-away cluster started here, removed at the end.

Two worker processes share one study without evaluating a trial twice; a worker killed with SIGKILL
mid-trial leaves a trial that the next worker fails (RDB heartbeat) and retries with the same
parameters. Where PostgreSQL's binaries or the psycopg driver are absent the tests fail, naming what to
install: they are part of what CI runs.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from typer.testing import CliRunner

from specbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
TUNE = ["tune", "--strategy", "ngram", "--heartbeat", 1]


def _postgres_bin() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, or Debian's /usr/lib/postgresql/<version>/bin."""
    if shutil.which("initdb") and shutil.which("pg_ctl"):
        return Path(shutil.which("initdb")).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    # not skipped: the README's test command installs the driver, and .ci/run the server's binaries
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail("psycopg is not installed: install the test dependencies with pip install -e '.[dev]'")
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL's initdb and pg_ctl were found neither on PATH nor in /usr/lib/postgresql/*/bin: "
                    "install PostgreSQL's server (Debian and Ubuntu: apt-get install postgresql)")
    # initdb refuses to run as root: the cluster then belongs to the postgres user
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(tempfile.mkdtemp(prefix="specbench-pg-"))
    if as_user:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
    port = _free_port()
    run = lambda *args: subprocess.run([*as_user, *map(str, args)], check=True, capture_output=True, timeout=120)  # noqa: E731
    try:
        run(bin_dir / "initdb", "-D", data / "db", "-A", "trust", "-U", "postgres", "--no-sync")
        run(bin_dir / "pg_ctl", "-D", data / "db", "-l", data / "log", "-w", "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_two_workers_on_postgresql(postgres_url, tiny_model_dir, tmp_path):
    result = invoke(*TUNE, "--limit", 3, "--max-new-tokens", 8, "--model", tiny_model_dir, "--workers", 2,
                    "--trials", 6, "--storage", postgres_url,
                    "--study", "pair", "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    trials = optuna.load_study(study_name="pair", storage=postgres_url).get_trials()
    assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2


def _running(storage: optuna.storages.RDBStorage, study: str) -> list[optuna.trial.FrozenTrial]:
    """Running trials whose parameters are set: a trial is RUNNING before its worker has sampled them."""
    try:
        running = optuna.load_study(study_name=study, storage=storage).get_trials(states=(TrialState.RUNNING,))
    except KeyError:  # not created yet
        return []
    return [t for t in running if t.params]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_killed_worker_trial_is_failed_and_retried(postgres_url, tiny_model_dir, tmp_path):
    # trials long enough (8 prompts of 32 tokens) for the kill to land inside one
    args = [*TUNE, "--limit", 8, "--max-new-tokens", 32, "--model", tiny_model_dir, "--trials", 4,
            "--storage", postgres_url, "--out", tmp_path]
    # one storage (one connection pool) for the polling: a storage per poll leaves a pool per poll open,
    # and a slow machine polls long enough to exhaust PostgreSQL's 100 connections
    storage = optuna.storages.RDBStorage(postgres_url)
    killed = None
    for attempt in range(3):  # the kill must land inside a trial, not between two
        study = f"killed{attempt}"
        worker = subprocess.Popen([sys.executable, "-m", "specbench", *map(str, args), "--study", study], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not _running(storage, study) and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        running = _running(storage, study)
        if running:
            killed = running[0]
            break
    assert killed is not None, "no worker was killed mid-trial"
    time.sleep(2.5)  # past the grace period: two heartbeats of one second
    result = invoke(*args, "--study", study, "--json")
    assert result.exit_code == 0, result.output
    trials = optuna.load_study(study_name=study, storage=postgres_url).get_trials()
    assert trials[killed.number].state == TrialState.FAIL
    retries = [t for t in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == killed.number]
    # the retry keeps every value the killed trial had suggested; a knob it was killed before suggesting
    # is drawn fresh (optuna's RetryHeartbeatStaleTrialCallback fixes the params it stored, no more)
    assert len(retries) == 1 and killed.params.items() <= retries[0].params.items()
    assert retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    outcomes = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(outcomes) == 4  # the study's total, the killed trial replaced by its retry
