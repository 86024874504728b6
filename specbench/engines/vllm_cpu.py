"""vLLM on a CPU as its CPU guide deploys it: TCMalloc and Intel OpenMP in the LD_PRELOAD of its processes
(Debian's libtcmalloc-minimal4; the intel-openmp wheel of the vllm extra), and its OpenMP threads bound to cores
(VLLM_CPU_OMP_THREADS_BIND, `auto`: each rank's threads on the cores of one NUMA node).

A preload acts only from a process's start: vLLM's engine processes (an `LLM` spawns them) and the servers serve
starts are started after the environment is set here, so it is in force in them from their start; specbench's
own process runs no vLLM model and is left as it is. Where a library is missing, or LD_PRELOAD already holds
another allocator or OpenMP runtime (two in one process would clash), vLLM runs as configured and a note says so.
`SPECBENCH_VLLM_PRELOAD=0` turns the preloads off, for the comparison with and without them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SWITCH = "SPECBENCH_VLLM_PRELOAD"  # 0: vLLM's processes start without the preloads
TCMALLOC = "libtcmalloc_minimal.so.4"
IOMP = "libiomp5.so"
# each library: what of it (or of a library doing its job) a preloaded name shows, and how to install it
LIBRARIES = {TCMALLOC: (("libtcmalloc", "libjemalloc", "libmimalloc"), "apt-get install libtcmalloc-minimal4"),
             IOMP: (("libiomp", "libgomp", "libomp."), 'pip install intel-openmp (the vllm extra)')}
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
THREADS_BIND_DEFAULT = "auto"  # the guide's: each rank's OpenMP threads bound to one NUMA node's cores
LIBRARY_DIRS = (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib", Path("/usr/lib/x86_64-linux-gnu"),
                Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib"))


@dataclass(frozen=True)
class CpuRuntime:
    """What vLLM's processes start with: the variables set in their environment, LD_PRELOAD as they get it, and
    what is not as the guide deploys it."""

    env: dict[str, str]
    preloaded: list[str]
    notes: list[str]

    def record(self) -> dict[str, object]:
        """As a run records it."""
        return {"LD_PRELOAD": self.preloaded, THREADS_BIND: self.env.get(THREADS_BIND)}


def find_library(name: str) -> str | None:
    """The library's path in this Python's lib directory (the intel-openmp wheel) or the system's."""
    return next((str(d / name) for d in LIBRARY_DIRS if (d / name).is_file()), None)


def deployment(environ: Mapping[str, str]) -> CpuRuntime:
    """The environment vLLM's processes start with, from `environ` (the process's): TCMalloc and Intel OpenMP
    ahead of what LD_PRELOAD holds, the thread binding as the user set it or the guide's default."""
    preload = [p for p in re.split(r"[:\s]+", environ.get("LD_PRELOAD", "")) if p]
    bind = {THREADS_BIND: environ.get(THREADS_BIND, THREADS_BIND_DEFAULT)}
    if environ.get(SWITCH) == "0":
        return CpuRuntime(bind, preload, [f"{SWITCH}=0: vLLM runs without the TCMalloc and Intel OpenMP preloads "
                                          "its CPU guide asks for"])
    added, notes = [], []
    for name, (kinds, install) in LIBRARIES.items():
        held = next((p for p in preload if any(kind in Path(p).name for kind in kinds)), None)
        if held is not None:
            if kinds[0] not in Path(held).name:
                notes.append(f"LD_PRELOAD already holds {held}: vLLM runs with it, not {name} as its CPU guide asks")
            continue
        path = find_library(name)
        if path is None:
            notes.append(f"{name} not found ({install}): vLLM runs without it, slower as its CPU guide warns")
        else:
            added.append(path)
    preloaded = added + preload
    return CpuRuntime({**bind, **({"LD_PRELOAD": ":".join(preloaded)} if added else {})}, preloaded, notes)


def cpu_build() -> bool:
    """Whether the vLLM installed is its CPU build (vllm-cpu), whose servers run on the CPU."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return bool(importlib.metadata.distribution("vllm-cpu"))
    return False


def loaded(pids: list[int]) -> dict[str, bool]:
    """Per library: whether every one of the processes has it (or its own kind: another TCMalloc build) mapped,
    read from /proc (processes that have exited are left out; none left: False)."""
    maps = []
    for pid in pids:
        with contextlib.suppress(OSError):
            maps.append(Path(f"/proc/{pid}/maps").read_text(errors="replace"))
    return {name: bool(maps) and all(kinds[0] in text for text in maps) for name, (kinds, _) in LIBRARIES.items()}


def apply(env: Mapping[str, str]) -> dict[str, str | None]:
    """Set `env` in this process's environment (which the processes it starts inherit); what it replaced, and
    LD_PRELOAD as it was in any case: vLLM's CPU platform adds PyTorch's libgomp to this process's LD_PRELOAD
    where it finds no Intel OpenMP there (vllm/platforms/cpu.py), which would otherwise stay for a later engine
    and keep Intel OpenMP out of its deployment."""
    before = {key: os.environ.get(key) for key in (*env, "LD_PRELOAD")}
    os.environ.update(env)
    return before


def restore(before: Mapping[str, str | None]) -> None:
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
