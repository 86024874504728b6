"""The workload `recommend` answers for: a GPU profile and what the user knows about the job.

Every field but the GPU is optional: a signal that was not given is not guessed, and a prior rule
that reads it is skipped (and says so). Validation gives one line per bad value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from specbench.analysis.hardware import GpuProfile, detect_local_gpu, get_profile, load_profiles
from specbench.core.errors import SpecbenchError
from specbench.core.ranges import check_ranges
from specbench.engines.engine_registry import ENGINE_NAMES

CUDA_EXPERIENCE = ("none", "some", "expert")
HIGH_PRECISION_TASKS = ("high_precision", "legal", "medical")
"""Tasks the practitioners' rules call high-precision work (the built-in suite's category and their words)."""
CREATIVE_TASKS = ("creative", "chat", "roleplay", "writing")  # the last two: SPEED-Bench's (and MT-bench's) words
DEFAULT_VERIFY_TOKENS = 8
"""Tokens one sequence verifies per step at the methods' default draft lengths (dspark's k_max, dflash's block)."""


@dataclass(frozen=True)
class Workload:
    gpu: GpuProfile
    gpu_origin: str  # "given", "detected" or "no GPU detected"
    task: str | None = None  # a category, e.g. code, chat, legal
    batch_size: int = 1
    context_len: int | None = None  # prompt + answer tokens per sequence; None: the evidence's own lengths
    temperature: float = 0.0
    vram_used_gb: float | None = None  # what the deployment already uses with plain decoding
    pcie_gen: int | None = None  # given, else the profile's
    bw_util: float | None = None  # memory-bandwidth utilisation of the current deployment, a fraction
    cuda_experience: str | None = None
    score_variance: float | None = None  # variance of the output scores (a practitioners' signal)
    model: str | None = None  # None: evidence of any model
    engine: str | None = None  # the deployment's engine (engines/engine_registry.py): its figures first; None: any

    @property
    def ridge_tokens(self) -> float:
        """Tokens per forward at which a bf16 forward stops being memory-bound on this GPU.

        A forward over T tokens reads every weight once (2 bytes each) and spends 2 FLOPs per weight
        per token, so compute catches up with memory at T = dense FLOP/s over bytes/s.
        """
        return self.gpu.bf16_tflops * 1e12 / (self.gpu.bandwidth_gbs * 1e9)

    @property
    def verify_budget(self) -> int:
        """Tokens each sequence of the batch can verify per step before the forward turns compute-bound."""
        return math.floor(self.ridge_tokens / self.batch_size)

    def describe(self) -> str:
        parts = [f"gpu {self.gpu.name} ({self.gpu_origin})", f"task {self.task or 'any'}",
                 f"batch {self.batch_size}", f"temperature {self.temperature:g}"]
        optional = [("context", self.context_len, "{} tokens"), ("vram used", self.vram_used_gb, "{:g} GB"),
                    ("pcie", self.pcie_gen, "{}.0"), ("bandwidth util", self.bw_util, "{:.0%}"),
                    ("cuda experience", self.cuda_experience, "{}"), ("score variance", self.score_variance, "{:g}"),
                    ("model", self.model, "{}"), ("engine", self.engine, "{}")]
        parts += [f"{label} {fmt.format(value)}" for label, value, fmt in optional if value is not None]
        return ", ".join(parts)


def make_workload(gpu: str | None = None, task: str | None = None, batch_size: int = 1,
                  context_len: int | None = None, temperature: float = 0.0, vram_used_gb: float | None = None,
                  pcie: int | None = None, bw_util: float | None = None, cuda_experience: str | None = None,
                  score_variance: float | None = None, model: str | None = None,
                  profiles: Path | None = None, engine: str | None = None) -> Workload:
    """Check every input and resolve the GPU: the named profile, else the local GPU, else `cpu`.

    The task's name is checked later, against the categories the prior and the evidence know.
    """
    check_ranges({"--batch-size": batch_size, "--context-len": context_len, "--temperature": temperature,
                  "--vram-used": vram_used_gb, "--pcie": pcie, "--bw-util": bw_util,
                  "--score-variance": score_variance})
    if cuda_experience is not None and cuda_experience not in CUDA_EXPERIENCE:
        raise SpecbenchError(f"--cuda-experience must be one of {', '.join(CUDA_EXPERIENCE)}, got {cuda_experience!r}")
    if engine is not None and engine not in ENGINE_NAMES:
        raise SpecbenchError(f"--engine {engine}: the deployment's engine is one of {', '.join(ENGINE_NAMES)}")
    profile, origin = _resolve_gpu(gpu, load_profiles(profiles))
    if vram_used_gb is not None and vram_used_gb > profile.memory_gb:
        raise SpecbenchError(f"--vram-used {vram_used_gb:g} GB exceeds the {profile.memory_gb:g} GB of {profile.name}")
    return Workload(gpu=profile, gpu_origin=origin, task=task.strip().lower() if task else None,
                    batch_size=batch_size, context_len=context_len, temperature=temperature,
                    vram_used_gb=vram_used_gb, pcie_gen=pcie if pcie is not None else profile.pcie_gen,
                    bw_util=bw_util, cuda_experience=cuda_experience, score_variance=score_variance,
                    model=model, engine=engine)


def _resolve_gpu(name: str | None, known: dict[str, GpuProfile]) -> tuple[GpuProfile, str]:
    if name is not None:
        return get_profile(name, known), "given"
    local = detect_local_gpu()
    if local is None:
        return known["cpu"], "no GPU detected"
    if local.profile is None:
        raise SpecbenchError(f"the local GPU ({local.name}) matches no profile; name one with --gpu "
                             f"(known: {', '.join(sorted(known))}) or add it with --profiles FILE")
    return known[local.profile], "detected"


def check_task(workload: Workload, known: set[str]) -> None:
    """An unknown task lists the valid ones: the prior's and those the evidence recorded."""
    if workload.task is not None and workload.task not in known:
        raise SpecbenchError(f"unknown task {workload.task!r}; valid: {', '.join(sorted(known))}")
