"""Loading the target and its tokenizer (HF id, local directory or the embedded default).

Loading is offline and quiet: decoding/model_source.py resolves the files locally, and transformers'
progress bars and notices are silenced while a model loads (gguf_model.quiet_loading, which a GGUF
conversion uses too; the CLI draws its own progress).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbench.core.errors import SpecbenchError
from specbench.core.ranges import DTYPE_CHOICES
from specbench.decoding.gguf import convert_gguf, quiet_loading
from specbench.decoding.kv_cache import check_supported
from specbench.decoding.model_source import ASSETS as ASSETS  # re-exported: where the embedded default lives
from specbench.decoding.model_source import DEFAULT_DIR as DEFAULT_DIR
from specbench.decoding.model_source import DEFAULT_MODEL, known_model, model_path

if TYPE_CHECKING:
    from specbench.plan.suites import SuiteItem

DTYPES = {name: getattr(torch, name) for name in DTYPE_CHOICES if name != "auto"}


@dataclass
class Target:
    model: torch.nn.Module
    tokenizer: object
    name: str
    eos_ids: frozenset[int]

    @property
    def device(self) -> torch.device:
        return self.model.device


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    if device not in ("cpu", "cuda"):
        raise SpecbenchError(f"--device {device}: expected auto, cpu or cuda")
    return torch.device(device)


BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them; None where they cannot be read (not Linux)."""
    try:
        with open(cpuinfo) as f:
            line = next((line for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    return frozenset(line.split(":", 1)[1].split()) if line else None


def resolve_dtype(dtype: str, device: torch.device, flags: frozenset[str] | None = None) -> torch.dtype:
    """The run's dtype; bfloat16 on a CPU is refused unless it has AVX512-BF16 or AMX (elsewhere the
    16-bit products are emulated, slower than float32, and every figure would be of the emulation)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecbenchError(f"--dtype {dtype}: expected auto, {', '.join(DTYPES)}")
    flags = cpu_flags() if flags is None else flags
    if dtype == "bfloat16" and device.type == "cpu" and flags is not None and not flags & BF16_CPU_FLAGS:
        raise SpecbenchError("--dtype bfloat16: this CPU has neither AVX512-BF16 nor AMX, so bfloat16 runs "
                             "emulated, slower than float32; use --dtype float32 here, or a GPU")
    return DTYPES[dtype]


def load_lm(name: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    try:
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation="sdpa",
                                                         local_files_only=True)
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"cannot load model {name}: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval()


def local_model(name: str | None) -> str:
    """model_path(name), converting a known model from its package's GGUF file on first use."""
    path = model_path(name)
    known = known_model(name)
    if known is not None and not known.converted():
        convert_gguf(known.source_file(), known.target_dir)
    return path


def load_target(name: str | None, device: torch.device, dtype: torch.dtype) -> Target:
    path = local_model(name)
    model = load_lm(path, device, dtype)
    check_supported(model.config)
    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise SpecbenchError(f"cannot load the tokenizer of {path}: {str(exc).splitlines()[0]}") from None
    eos = model.generation_config.eos_token_id if model.generation_config else None
    eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos_ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return Target(model, tokenizer, name or DEFAULT_MODEL, frozenset(eos_ids))


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the architecture and the output embedding: what a drafter was trained against."""
    # not the transformers version that wrote the config (vLLM pins an older one than specbench's own)
    config = {k: v for k, v in model.config.to_dict().items()
              if k not in ("_name_or_path", "dtype", "torch_dtype", "transformers_version")}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    head = model.get_output_embeddings().weight.detach().float().cpu()
    digest.update(head[:, :64].contiguous().numpy().round(3).tobytes())
    return digest.hexdigest()[:16]


def context_limit(target: Target) -> int | None:
    """The positions the target's model takes, where its config says."""
    return getattr(target.model.config, "max_position_embeddings", None)


def chat_messages(turns: Sequence[str], answers: Sequence[str]) -> list[dict[str, str]]:
    """The user turns so far, interleaved with the answers to them, as a chat template takes them."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def encode_turns(tokenizer, turns: list[str], answers: list[str]) -> list[int]:
    """Token ids for the next answer: the user turns so far, interleaved with the model's own answers."""
    messages = chat_messages(turns, answers)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n\n".join(m["content"] for m in messages) + "\n\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_turn(tokenizer, item: SuiteItem, turn: int = 0, answers: Sequence[str] = ()) -> list[int]:
    """Token ids for the answer to a suite item's turn: its user turns so far, interleaved with the model's
    own answers to the earlier ones (in `run` and `tune` alike: `ar`'s, so every strategy sees one context)."""
    return encode_turns(tokenizer, list(item.turns[:turn + 1]), list(answers))


def answer_text(tokenizer, ids: list[int]) -> str:
    """An answer as the next turn's context holds it."""
    return tokenizer.decode(ids, skip_special_tokens=True)
