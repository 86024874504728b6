"""Reading input files with one clear error, and writing output files atomically.

Every file specbench writes goes through `atomic_path`: it is written beside its final name and
renamed into place, so an interruption leaves the old file or the new one, never a torn one.
Readers raise `SpecbenchError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from specbench.core.errors import SpecbenchError
from specbench.core.strict_json import dumps


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write (a file or a directory), renamed onto `path`
    when the block succeeds and removed when it fails. The temporary name holds the process id, so two
    processes writing one file (tune's workers) never write into each other's, and keeps the suffix, so
    writers that pick a format by suffix (matplotlib) still do."""
    path = Path(path)
    tmp = path.with_name(f"{path.stem}.writing-{os.getpid()}{path.suffix}")
    _remove(tmp)
    try:
        yield tmp
        if path.is_dir() and tmp.is_dir():
            shutil.rmtree(path)  # os.replace renames a directory onto an empty one only
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    """Strict JSON (NaN and infinities as null), indented, ending in a newline."""
    write_atomic(path, dumps(data, indent=2) + "\n")


def read_text(path: Path, what: str, kind: str = "") -> str:
    """The UTF-8 text of `path` (a byte-order mark dropped); `what` names the file in errors ("config file"),
    `kind` its format ("TOML")."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SpecbenchError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError:
        raise SpecbenchError(f"{what} {path} is not a {kind + ' ' if kind else ''}text file (it is not UTF-8 text)"
                             ) from None
    except OSError as exc:
        raise SpecbenchError(f"{what} {path}: cannot read it ({exc.strerror})") from None


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_text(path, what, "JSON"))
    except json.JSONDecodeError as exc:
        raise SpecbenchError(f"{what} {path} is not valid JSON: {exc}") from None


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise SpecbenchError(f"{what} {path} must hold a JSON object")
    return data


def read_jsonl(path: Path, what: str, cut_tail: bool = False) -> tuple[list[Any], bool]:
    """The values of a JSON Lines file, blank lines skipped, and whether its last line was dropped: with
    `cut_tail` (a file appended to until an interruption) a last line that does not parse is a write cut
    off, dropped; any other line that does not parse is an error."""
    lines = read_text(path, what, "JSON Lines").splitlines()
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if cut_tail and number == len(lines):
                return values, True
            raise SpecbenchError(f"{what} {path} line {number} is not valid JSON: {exc}") from None
    return values, False


def read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(read_text(path, what, "TOML"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecbenchError(f"{what} {path} is not valid TOML: {exc}") from None
