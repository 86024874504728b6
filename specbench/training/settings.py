"""What `specbench train` is asked to do, checked before torch is imported or anything is written.

An unfinished training keeps its data cache and checkpoint in `OUT.partial/` with the settings it
was started with (settings.json); running the same command again resumes it, and other settings
are refused (they would not match the checkpoint) unless `--force` discards it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_json, write_json
from specbench.core.paths import check_output_dir
from specbench.core.ranges import check_device, check_ranges
from specbench.decoding.model_source import model_path
from specbench.methods.registry import DRAFTER_NAMES
from specbench.plan.run_config import DecodeSettings
from specbench.plan.sharegpt import read_conversations
from specbench.plan.suites import Suite, load_suite, select

SETTINGS = "settings.json"


def partial_dir(out_dir: Path) -> Path:
    """Where an unfinished training keeps its data cache and checkpoint (never looks like a drafter)."""
    return Path(out_dir).with_name(Path(out_dir).name + ".partial")


@dataclass(kw_only=True)
class TrainSettings(DecodeSettings):
    strategy: str
    prompts: str | None  # suite name or file
    out_dir: Path
    synthesise: int = 0  # or: this many instructions the target writes itself (Magpie), and its answers
    dataset: str | None = None  # or: users' conversations, `sharegpt` or a file in its layout (`limit` of them)
    limit: int | None = None  # every prompt
    max_new_tokens: int = 128  # the length of the target's regenerated answers
    steps: int = 300
    batch_size: int = 8
    lr: float = 1e-3
    force: bool = False  # replace a drafter of another strategy, discard an unfinished training of other settings

    def check(self) -> Suite | None:
        """Every check that needs no torch; the selected training prompts (None: the target writes them)."""
        if self.strategy not in DRAFTER_NAMES:
            raise SpecbenchError(f"unknown strategy {self.strategy!r}; known: {', '.join(DRAFTER_NAMES)}")
        check_ranges({"--steps": self.steps, "--batch-size": self.batch_size, "--lr": self.lr,
                      "--max-new-tokens": self.max_new_tokens, "--limit": self.limit, "--seed": self.seed,
                      "--synthesise": self.synthesise})
        if sum(map(bool, (self.prompts, self.synthesise, self.dataset))) != 1:
            raise SpecbenchError("give the training prompts with --prompts FILE, --synthesise N to have the "
                                 "target write N instructions itself, or --dataset sharegpt|FILE of users' "
                                 "conversations; one of the three")
        if self.dataset:
            read_conversations(self.dataset, limit=1)  # the extra installed, the file of ShareGPT's layout
        check_device(self.device)
        other = sorted(set(self.knobs) - {self.strategy})
        if other:
            raise SpecbenchError(f"--set for {', '.join(other)} does not apply to training {self.strategy}")
        suite = select(load_suite(self.prompts), limit=self.limit or None) if self.prompts else None  # 0: all
        model_path(self.model)
        self._check_out_dir()
        self._check_unfinished()
        return suite

    def recorded(self) -> dict[str, Any]:
        """What an unfinished training must share with this one to resume it."""
        return {k: v for k, v in asdict(self).items() if k not in ("out_dir", "device", "force")}

    def unfinished_differs(self) -> bool:
        """OUT.partial holds an unfinished training started with other settings (or with none recorded)."""
        work = partial_dir(self.out_dir)
        if not work.exists():
            return False
        try:
            return read_json(work / SETTINGS, "training settings") != self.recorded()
        except SpecbenchError:
            return True

    def record(self) -> None:
        """Create OUT.partial and write these settings into it."""
        work = partial_dir(self.out_dir)
        work.mkdir(parents=True, exist_ok=True)
        write_json(work / SETTINGS, self.recorded())

    def _check_out_dir(self) -> None:
        out = Path(self.out_dir)
        if out.exists() and not out.is_dir():
            raise SpecbenchError(f"--out {out} is a file; give a directory for the drafter")
        if out.is_dir() and any(out.iterdir()):
            found = _drafter_strategy(out)
            if found is None:
                raise SpecbenchError(f"--out {out} holds files that are not a specbench drafter; refusing to "
                                     "replace them: choose another directory")
            if found != self.strategy and not self.force:
                raise SpecbenchError(f"--out {out} holds a {found} drafter; training {self.strategy} would replace "
                                     "it: choose another directory, or pass --force")
        check_output_dir(out.parent, "--out")

    def _check_unfinished(self) -> None:
        if self.unfinished_differs() and not self.force:
            raise SpecbenchError(f"{partial_dir(self.out_dir)} holds an unfinished training with other settings; "
                                 "run its command again to finish it, or pass --force to discard it")


def _drafter_strategy(path: Path) -> str | None:
    """The strategy of the specbench drafter in `path`; None when it holds something else."""
    try:
        config = read_json(path / "config.json", "drafter config")
    except SpecbenchError:
        return None
    return config.get("specbench_strategy") if isinstance(config, dict) else None
