"""Where a model's files are: the embedded default, a local directory, or a Hugging Face hub id
already in the local cache.

specbench downloads nothing (a benchmark must not time or depend on the network), so a hub id
that is not cached is refused at once with what to do instead. Torch-free: a bad `--model` is
refused before anything heavy is imported.
"""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError

ASSETS = Path(__file__).parent / "assets"
DEFAULT_MODEL = "default"
DEFAULT_DIR = ASSETS / "default"


def looks_like_path(name: str) -> bool:
    """`./x`, `/x`, `~/x` and `a/b/c` are directories; `gpt2` and `Qwen/Qwen3-8B` may be hub ids."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def model_path(name: str | None, cache_dir: str | Path | None = None, what: str = "model") -> str:
    """The directory holding the model `name` (None or "default": the embedded model).

    `cache_dir` overrides the Hugging Face cache (HF_HUB_CACHE) for a hub id; `what` is how errors
    call it (a drafter's checkpoint is found the same way).
    """
    if name in (None, DEFAULT_MODEL):
        if not (DEFAULT_DIR / "target" / "config.json").is_file():
            raise SpecbenchError("the embedded default model is missing; "
                                 "rebuild it with scripts/build_default_model.py")
        return str(DEFAULT_DIR / "target")
    path = Path(name).expanduser()
    if path.exists() or looks_like_path(name):
        if not (path / "config.json").is_file():
            raise SpecbenchError(f"{what} path {name}: no such {what} directory (config.json not found)")
        return str(path)
    return _cached_snapshot(name, cache_dir, what)


def _cached_snapshot(repo_id: str, cache_dir: str | Path | None, what: str = "model") -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True))
    except HFValidationError:
        raise SpecbenchError(f"{what} {repo_id}: neither a {what} directory nor a Hugging Face model id") from None
    except LocalEntryNotFoundError:
        raise SpecbenchError(f"{what} {repo_id} is not available offline: it is not a local directory and not in "
                             f"the Hugging Face cache, and specbench downloads nothing; fetch it first "
                             f"(`hf download {repo_id}`) or pass a {what} directory") from None
    if not (snapshot / "config.json").is_file():
        raise SpecbenchError(f"{what} {repo_id}: the cached copy in {snapshot} has no config.json (an interrupted "
                             f"download?); fetch it again with `hf download {repo_id}`")
    return str(snapshot)
