"""A method's setting as the serving engines read it: vLLM's `speculative_config`, SGLang's flags.

A translation, not a measurement: the engines implement each method their own way (their trees,
schedulers and kernels differ), so these carry over the settings that have a counterpart and nothing
measured here. Each method module declares its own translation (Method.serving); knobs with no
counterpart are named per engine, so `specbench run --engine vllm` refuses a setting vLLM would
ignore and `specbench tune` lists them beside its translation. Combinations have no counterpart.

Torch-free, so that the vLLM engine's input checks run before torch is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DRAFTER = "DRAFTER_DIR"  # placeholder where no drafter directory was given
CONTROLLER = "controller"  # how a controller other than the engine's own is named among the untranslated


@dataclass(frozen=True)
class Serving:
    vllm: dict[str, Any] | None  # vLLM's speculative_config; None where vLLM has no such method
    sglang: list[str] | None  # SGLang's --speculative-* flags; None where SGLang has none
    vllm_missing: tuple[str, ...] = ()  # knobs (or `controller`) vLLM has no counterpart for
    sglang_missing: tuple[str, ...] = ()

    def untranslated(self) -> list[str]:
        """What does not carry over, engine by engine, as a person reads it."""
        both = [k for k in self.vllm_missing if k in self.sglang_missing]
        only = [(k, "vLLM") for k in self.vllm_missing if k not in both] + \
               [(k, "SGLang") for k in self.sglang_missing if k not in both]
        return both + [f"{k} in {engine}" for k, engine in only]

    def as_json(self) -> dict[str, Any]:
        return {"translation": True, "vllm": {"speculative_config": self.vllm},
                "sglang": {"flags": [str(v) for v in self.sglang or []]}, "untranslated": self.untranslated()}


def fixed_only(controller: str) -> tuple[str, ...]:
    """The engines draft a fixed length: any other controller is untranslated."""
    return () if controller == "fixed" else (CONTROLLER,)


def engines_markdown(study: str, model: str, engines: dict[str, Any]) -> str:
    """A translation (Serving.as_json) as commands a person can paste, marked as a translation."""
    vllm = json.dumps(engines["vllm"]["speculative_config"])
    sglang = " ".join(engines["sglang"]["flags"])
    lines = [f"# {study}: engine configurations (a translation, not a measurement)", "",
             "specbench measured its own implementation; these carry the tuned settings that have a",
             "counterpart over to the engines, which implement the method their own way. Measure them there.", "",
             "vLLM:", "", f"    vllm serve {model} --speculative-config '{vllm}'", ""]
    # no flags: SGLang has no such method (Serving.sglang None)
    lines += (["SGLang:", "", f"    python -m sglang.launch_server --model-path {model} {sglang}", ""] if sglang
              else ["SGLang: no counterpart of this method.", ""])
    if engines["untranslated"]:
        lines += [f"Not translated (no counterpart): {', '.join(engines['untranslated'])}.", ""]
    if DRAFTER in vllm:
        lines += [f"{DRAFTER}: the drafter checkpoint in the engine's own format.", ""]
    return "\n".join(lines)
