"""The tuned setting translated into vLLM's `--speculative-config` and SGLang's `--speculative-*` flags.

A translation, not a measurement: the engines implement each method their own way (their trees,
schedulers and kernels differ), so these carry over the settings that have a counterpart and nothing
measured here. Knobs with none (the entropy threshold, DSpark's confidence cut and scheduler, the
controllers) are listed as untranslated. Combinations have no counterpart in either engine.
"""

from __future__ import annotations

import json
from typing import Any

DRAFTER = "DRAFTER_DIR"  # placeholder where no --drafter directory was given


def _mtp_tree_size(options: dict[str, Any]) -> int:
    widths = [int(w) for w in str(options["branching"]).split(",")]
    size, level = 0, 1
    for depth in range(options["n_modules"]):
        level *= widths[min(depth, len(widths) - 1)]
        size += level
    return size


def translate(strategy: str, options: dict[str, Any], controller: str, drafter: str | None) -> dict[str, Any] | None:
    """{"vllm": speculative config, "sglang": flags, "untranslated": knobs} for one method, or None."""
    path = drafter or DRAFTER
    o = options
    if strategy == "ngram":
        vllm = {"method": "ngram", "num_speculative_tokens": o["num_pred_tokens"], "prompt_lookup_max": o["max_ngram"],
                "prompt_lookup_min": 1}
        sglang = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", o["num_pred_tokens"],
                  "--speculative-ngram-min-match-window-size", 1,
                  "--speculative-ngram-max-match-window-size", o["max_ngram"]]
        untranslated = [] if controller == "fixed" else ["controller"]
    elif strategy == "draft":
        vllm = {"method": "draft_model", "model": path, "num_speculative_tokens": o["k"]}
        sglang = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", path,
                  "--speculative-num-steps", o["k"], "--speculative-eagle-topk", 1,
                  "--speculative-num-draft-tokens", o["k"] + 1]
        untranslated = [] if controller == "fixed" else ["controller"]
    elif strategy == "eagle":
        # vLLM drafts EAGLE-3 as a chain of `depth` tokens; SGLang takes the EAGLE-2 tree settings
        # (its draft-token count includes the verified root)
        vllm = {"method": "eagle3", "model": path, "num_speculative_tokens": o["depth"]}
        sglang = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", path,
                  "--speculative-num-steps", o["depth"], "--speculative-eagle-topk", o["top_k"],
                  "--speculative-num-draft-tokens", o["total_tokens"] + 1]
        untranslated = ["top_k and total_tokens in vLLM (it drafts a chain)"]
    elif strategy == "mtp":
        top = int(str(o["branching"]).split(",")[0])
        vllm = {"method": "mtp", "num_speculative_tokens": o["n_modules"]}
        sglang = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", o["n_modules"],
                  "--speculative-eagle-topk", top, "--speculative-num-draft-tokens", _mtp_tree_size(o) + 1]
        untranslated = ["entropy_threshold", "branching below level 1"]
    elif strategy in ("dflash", "dspark"):
        # DSpark: no engine runs its confidence cut or scheduler; only the block (the draft length) carries over
        drafts = o["block_size"] - 1 if strategy == "dflash" else o["block_size"]
        if strategy == "dspark" and controller == "dspark":
            drafts = min(drafts, o["k_max"] - 1)
        vllm = {"method": "dflash", "model": path, "num_speculative_tokens": drafts}
        sglang = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", path,
                  "--speculative-dflash-block-size", drafts + 1,
                  "--speculative-dflash-draft-window-size", o["context_window"]]
        untranslated = ([] if controller == "fixed" else ["controller"]) + (
            ["confidence_threshold", "the scheduler", "the Markov and confidence heads (a DSpark checkpoint is "
             "not a DFlash one)"] if strategy == "dspark" else [])
    else:
        return None
    return {"translation": True, "vllm": {"speculative_config": vllm},
            "sglang": {"flags": [str(v) for v in sglang]}, "untranslated": untranslated}


def engines_markdown(study: str, model: str, engines: dict[str, Any]) -> str:
    """The translation as commands a person can paste, marked as a translation."""
    vllm = json.dumps(engines["vllm"]["speculative_config"])
    sglang = " ".join(engines["sglang"]["flags"])
    lines = [f"# {study}: engine configurations (a translation, not a measurement)", "",
             "specbench measured its own implementation; these carry the tuned settings that have a",
             "counterpart over to the engines, which implement the method their own way. Measure them there.", "",
             "vLLM:", "", f"    vllm serve {model} --speculative-config '{vllm}'", "",
             "SGLang:", "", f"    python -m sglang.launch_server --model-path {model} {sglang}", ""]
    if engines["untranslated"]:
        lines += [f"Not translated (no counterpart): {', '.join(engines['untranslated'])}.", ""]
    if DRAFTER in vllm:
        lines += [f"{DRAFTER}: the drafter checkpoint in the engine's own format.", ""]
    return "\n".join(lines)
