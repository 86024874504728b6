"""The workload `recommend` answers for: a GPU profile and what the user knows about the job.

Every field but the GPU is optional: a signal that was not given is not guessed, and a prior rule
that reads it is skipped (and says so). Validation gives one line per bad value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.hardware import GpuProfile, detect_local_gpu, get_profile, load_profiles

CUDA_EXPERIENCE = ("none", "some", "expert")
PCIE_GENERATIONS = (3, 4, 5, 6)
HIGH_PRECISION_TASKS = ("high_precision", "legal", "medical")
"""Tasks source article 1 calls high-precision work (the built-in suite's category and the article's words)."""
CREATIVE_TASKS = ("creative", "chat")
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
    bw_util_pct: float | None = None  # memory-bandwidth utilisation of the current deployment
    cuda_experience: str | None = None
    score_variance: float | None = None  # variance of the output scores (source article 1's signal)
    model: str | None = None  # None: evidence of any model

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
                    ("pcie", self.pcie_gen, "{}.0"), ("bandwidth util", self.bw_util_pct, "{:g}%"),
                    ("cuda experience", self.cuda_experience, "{}"), ("score variance", self.score_variance, "{:g}"),
                    ("model", self.model, "{}")]
        parts += [f"{label} {fmt.format(value)}" for label, value, fmt in optional if value is not None]
        return ", ".join(parts)


def make_workload(gpu: str | None = None, task: str | None = None, batch_size: int = 1,
                  context_len: int | None = None, temperature: float = 0.0, vram_used_gb: float | None = None,
                  pcie: int | None = None, bw_util_pct: float | None = None, cuda_experience: str | None = None,
                  score_variance: float | None = None, model: str | None = None,
                  profiles: Path | None = None) -> Workload:
    """Check every input and resolve the GPU: the named profile, else the local GPU, else `cpu`.

    The task's name is checked later, against the categories the prior and the evidence know.
    """
    known = load_profiles(profiles)
    profile, origin = _resolve_gpu(gpu, known)
    if batch_size < 1:
        raise SpecbenchError(f"--batch-size must be at least 1, got {batch_size}")
    if context_len is not None and context_len < 1:
        raise SpecbenchError(f"--context-len must be at least 1, got {context_len}")
    if not temperature >= 0:
        raise SpecbenchError(f"--temperature must be >= 0, got {temperature}")
    if vram_used_gb is not None:
        if not vram_used_gb >= 0:
            raise SpecbenchError(f"--vram-used must be >= 0 GB, got {vram_used_gb}")
        if vram_used_gb > profile.memory_gb:
            raise SpecbenchError(f"--vram-used {vram_used_gb:g} GB exceeds the {profile.memory_gb:g} GB "
                                 f"of {profile.name}")
    if pcie is not None and pcie not in PCIE_GENERATIONS:
        raise SpecbenchError(f"--pcie must be a PCIe generation in {PCIE_GENERATIONS[0]}-{PCIE_GENERATIONS[-1]}, "
                             f"got {pcie}")
    if bw_util_pct is not None and not 0 <= bw_util_pct <= 100:
        raise SpecbenchError(f"--bw-util must be a percentage in 0-100, got {bw_util_pct}")
    if cuda_experience is not None and cuda_experience not in CUDA_EXPERIENCE:
        raise SpecbenchError(f"--cuda-experience must be one of {', '.join(CUDA_EXPERIENCE)}, got {cuda_experience!r}")
    if score_variance is not None and not score_variance >= 0:
        raise SpecbenchError(f"--score-variance must be >= 0, got {score_variance}")
    return Workload(gpu=profile, gpu_origin=origin, task=task.strip().lower() if task else None,
                    batch_size=batch_size, context_len=context_len, temperature=temperature,
                    vram_used_gb=vram_used_gb, pcie_gen=pcie if pcie is not None else profile.pcie_gen,
                    bw_util_pct=bw_util_pct, cuda_experience=cuda_experience, score_variance=score_variance,
                    model=model)


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
