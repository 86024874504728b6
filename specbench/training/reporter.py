"""How a long training job says how it goes, without knowing who listens (a progress bar, a log, a test)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Reporter:
    """A phase's progress (phase, done, total, detail such as the loss), and lines worth keeping."""

    progress: Callable[[str, int, int, str], None] = lambda phase, done, total, detail: None
    say: Callable[[str], None] = lambda line: None
