"""vLLM's processes as its CPU guide deploys them (engines/vllm_cpu.py): TCMalloc and Intel OpenMP preloaded, the
thread binding set, what is not as the guide asks said in a note; and a process started with that environment
really has both libraries loaded (read from /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.engines import vllm_cpu
from specbench.engines.vllm_cpu import IOMP, SWITCH, TCMALLOC, THREADS_BIND, apply, deployment, loaded, restore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
INSTALLED = vllm_cpu.find_library(TCMALLOC) and vllm_cpu.find_library(IOMP)
needs_both = pytest.mark.skipif(not INSTALLED, reason="libtcmalloc-minimal4 (.ci/run) and intel-openmp (vllm extra)")


@needs_both
def test_both_libraries_go_ahead_of_what_ld_preload_holds_and_threads_are_bound():
    runtime = deployment({"LD_PRELOAD": "/opt/mine.so"})
    assert [Path(p).name for p in runtime.preloaded] == [TCMALLOC, IOMP, "mine.so"]
    assert runtime.env == {"LD_PRELOAD": ":".join(runtime.preloaded), THREADS_BIND: "auto"}
    assert runtime.notes == []
    assert deployment({THREADS_BIND: "0-1"}).env[THREADS_BIND] == "0-1"  # the user's binding is kept


@needs_both
def test_another_allocator_or_openmp_already_preloaded_is_kept_and_said():
    runtime = deployment({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2 /usr/lib/libgomp.so.1"})
    assert runtime.preloaded == ["/usr/lib/libjemalloc.so.2", "/usr/lib/libgomp.so.1"]
    assert "LD_PRELOAD" not in runtime.env
    assert [note.split(":")[0] for note in runtime.notes] == ["LD_PRELOAD already holds /usr/lib/libjemalloc.so.2",
                                                              "LD_PRELOAD already holds /usr/lib/libgomp.so.1"]
    mine = deployment({"LD_PRELOAD": f"/x/{TCMALLOC}:/y/{IOMP}"})  # the user's own: in force, nothing to say
    assert mine.notes == [] and mine.preloaded == [f"/x/{TCMALLOC}", f"/y/{IOMP}"]


def test_a_missing_library_is_a_note_and_the_run_goes_on(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_cpu, "LIBRARY_DIRS", (tmp_path,))
    runtime = deployment({})
    assert runtime.env == {THREADS_BIND: "auto"} and runtime.preloaded == []
    assert [n.split(" (")[0] for n in runtime.notes] == [f"{TCMALLOC} not found", f"{IOMP} not found"]
    assert "apt-get install libtcmalloc-minimal4" in runtime.notes[0]


def test_the_switch_turns_the_preloads_off():
    runtime = deployment({SWITCH: "0", "LD_PRELOAD": "/opt/mine.so"})
    assert "LD_PRELOAD" not in runtime.env and runtime.preloaded == ["/opt/mine.so"]
    assert runtime.notes[0].startswith(f"{SWITCH}=0: vLLM runs without")


def test_apply_and_restore_leave_the_environment_as_it_was(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    monkeypatch.delenv(THREADS_BIND, raising=False)
    before = apply({"LD_PRELOAD": "/a.so:/opt/mine.so", THREADS_BIND: "auto"})
    assert os.environ["LD_PRELOAD"] == "/a.so:/opt/mine.so" and os.environ[THREADS_BIND] == "auto"
    restore(before)
    assert os.environ["LD_PRELOAD"] == "/opt/mine.so" and THREADS_BIND not in os.environ


def test_what_vllm_adds_to_the_preloads_goes_when_its_engine_closes(monkeypatch):
    """vLLM's CPU platform puts libgomp into this process's LD_PRELOAD; left there, the next engine's deployment
    would find an OpenMP runtime already preloaded and leave Intel OpenMP out."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    before = apply({THREADS_BIND: "auto"})  # as with SPECBENCH_VLLM_PRELOAD=0
    os.environ["LD_PRELOAD"] = "/torch/lib/libgomp.so.1"  # what vLLM does meanwhile
    restore(before)
    assert "LD_PRELOAD" not in os.environ


@needs_both
def test_a_process_started_with_the_deployment_has_both_libraries_loaded():
    sleeper = [sys.executable, "-c", "import sys; print('started', flush=True); sys.stdin.read()"]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    deployed, plain = (subprocess.Popen(sleeper, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e)
                       for e in ({**env, **deployment(env).env}, env))
    try:
        for process in (deployed, plain):
            assert process.stdout.readline() == b"started\n"  # past the loader: whatever it preloads is mapped
        assert loaded([deployed.pid]) == {TCMALLOC: True, IOMP: True}
        assert loaded([plain.pid]) == {TCMALLOC: False, IOMP: False}
        assert loaded([]) == {TCMALLOC: False, IOMP: False}
    finally:
        for process in (deployed, plain):
            process.communicate(b"")
