"""Prompt suites: load a built-in suite or a suite file, and select prompts from it.

File formats, detected from content (and the .json extension):
- AlpacaEval JSON: a list of objects with "instruction"; "dataset" is the category.
- MT-bench / Spec-Bench question.jsonl: one object per line with "question_id", "category", "turns".
- Plain JSONL: one object per line with "prompt" and optional "category".
- SPEED-Bench (NVIDIA, arXiv 2604.09557), as its reference preparation writes it: a directory of
  one JSONL file per split, `qualitative.jsonl` (880 prompts in 11 categories: coding, humanities,
  math, multilingual, qa, rag, reasoning, roleplay, stem, summarization, writing) and
  `throughput_{1k,2k,8k,16k,32k}.jsonl` (1,536 prompts of about that many input tokens each, in the
  categories low_entropy, mixed and high_entropy); each line has "question_id", "category" and
  "messages" (the user turns as {"role", "content"}) beside the dataset's other fields. A directory
  means its qualitative split, as in `vllm bench serve --dataset-name speed_bench`; a split's file
  is named directly. Layout: NVIDIA-NeMo/Skills nemo_skills/dataset/speed-bench/prepare.py (which
  vLLM's SpeedBench dataset, vllm/benchmarks/datasets, reads from), the nvidia/SPEED-Bench dataset
  card, and AIPerf's speed_bench loader (the categories). The published parquet leaves some turns to
  be fetched from their source datasets (a placeholder text): those are refused, not measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specbench.core.errors import SpecbenchError
from specbench.core.files import read_text

DEFAULT_SUITE = "specbench"
UNCATEGORIZED = "uncategorized"
SUITE_SUFFIXES = (".json", ".jsonl")
SPEED_BENCH_CATEGORIES = ("coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
                          "summarization", "writing")  # its qualitative split's
SPEED_BENCH_SPLIT = "qualitative"  # what a SPEED-Bench directory means, as in vLLM's benchmark
UNFETCHED = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE"  # SPEED-Bench's placeholder turns


@dataclass(frozen=True)
class SuiteItem:
    id: str
    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    name: str
    items: tuple[SuiteItem, ...]

    def categories(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.category] = counts.get(item.category, 0) + 1
        return dict(sorted(counts.items()))


def suites_dir() -> Path:
    """The folder of built-in suites: packaged in the wheel, or the repo's suites/ folder."""
    here = Path(__file__).resolve().parents[1]  # the package: its builtin_suites, or the repository's suites/
    candidates = (here / "builtin_suites", here.parent / "suites")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise SpecbenchError(f"built-in suites folder not found (looked in {candidates[0]} and {candidates[1]})")


def _builtin_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for path in sorted(suites_dir().iterdir()):
        if path.is_file() and path.suffix in SUITE_SUFFIXES:
            files.setdefault(path.stem, path)
    return files


def builtin_suite_names() -> list[str]:
    return sorted(_builtin_files())


def load_suite(name_or_path: str | Path) -> Suite:
    """Load a built-in suite by name ("default" is an alias of "specbench") or a suite file by path."""
    path = Path(name_or_path)
    if isinstance(name_or_path, Path) or path.suffix or len(path.parts) > 1:
        return _load_file(path)
    name = DEFAULT_SUITE if name_or_path == "default" else name_or_path
    builtins = _builtin_files()
    if name in builtins:
        return _load_file(builtins[name])
    if path.is_file():
        return _load_file(path)
    known = ", ".join(["default", *sorted(builtins)])
    raise SpecbenchError(f"unknown suite {name_or_path!r}; built-in suites: {known} (or give a .json/.jsonl file path)")


def select(suite: Suite, categories: Sequence[str] | None = None, limit: int | None = None) -> Suite:
    """Keep the prompts of the given categories, then at most `limit` of them, taken round-robin
    across categories so that every category is represented; the suite's order is kept."""
    if limit is not None and limit < 1:
        raise SpecbenchError(f"limit must be at least 1, got {limit}")
    items = suite.items
    if categories:
        valid = suite.categories()
        unknown = [category for category in categories if category not in valid]
        if unknown:
            raise SpecbenchError(
                f"unknown category {', '.join(map(repr, unknown))} in suite {suite.name}; valid: {', '.join(valid)}"
            )
        wanted = set(categories)
        items = tuple(item for item in items if item.category in wanted)
    if not items:
        raise SpecbenchError(f"suite {suite.name}: no prompts selected")
    if limit is not None and limit < len(items):
        items = _round_robin(items, limit)
    return Suite(name=suite.name, items=items)


def _round_robin(items: tuple[SuiteItem, ...], limit: int) -> tuple[SuiteItem, ...]:
    positions: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        positions.setdefault(item.category, []).append(index)
    chosen: list[int] = []
    for rank in range(max(len(indices) for indices in positions.values())):
        chosen.extend(indices[rank] for indices in positions.values() if rank < len(indices))
    return tuple(items[index] for index in sorted(chosen[:limit]))


def _load_file(path: Path) -> Suite:
    if path.is_dir():
        return _speed_bench_dir(path)
    text = read_text(path, "suite file")
    if not text.strip():
        raise SpecbenchError(f"{path}: file is empty")
    if text.lstrip().startswith("[") or (path.suffix == ".json" and _is_one_json_value(text)):
        items = _alpaca_eval_items(path, text)
    else:
        items = _jsonl_items(path, text)
    if not items:
        raise SpecbenchError(f"{path}: no prompts in file")
    return Suite(name=path.stem, items=tuple(items))


def _speed_bench_dir(path: Path) -> Suite:
    """A prepared SPEED-Bench directory: its qualitative split, named after the directory."""
    split = path / f"{SPEED_BENCH_SPLIT}.jsonl"
    if not split.is_file():
        raise SpecbenchError(f"{path} is a directory without {split.name}: give a suite file, or SPEED-Bench's "
                             "directory as NeMo-Skills' speed-bench prepare.py writes it")
    return replace(_load_file(split), name=f"{path.resolve().name}-{SPEED_BENCH_SPLIT}")


def _is_one_json_value(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _alpaca_eval_items(path: Path, text: str) -> list[SuiteItem]:
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecbenchError(f"{path} line {error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(entries, list):
        raise SpecbenchError(f'{path}: expected a JSON list of objects with "instruction" (AlpacaEval format)')
    items: list[SuiteItem] = []
    per_category: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{path} entry [{index}]"
        entry = _as_object(entry, where)
        instruction = _required_text(entry, "instruction", where)
        category = _category(entry, "dataset", where)
        per_category[category] = per_category.get(category, 0) + 1
        items.append(SuiteItem(f"{path.stem}-{category}-{per_category[category]}", category, (instruction,)))
    return items


def _jsonl_items(path: Path, text: str) -> list[SuiteItem]:
    items: list[SuiteItem] = []
    question_ids: set[str] = set()
    shape = ""
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_number}"
        try:
            entry = _as_object(json.loads(line), where)
        except json.JSONDecodeError:
            raise SpecbenchError(f"{where}: not valid JSON") from None
        shape = shape or next((key for key in ("turns", "messages") if key in entry), "prompt")
        if shape in ("turns", "messages"):
            item = _question_item(entry, shape, where)
            if item.id in question_ids:
                raise SpecbenchError(f"{where}: duplicate question_id {entry['question_id']!r}")
            question_ids.add(item.id)
        else:
            prompt = _required_text(entry, "prompt", where)
            item = SuiteItem(str(line_number), _category(entry, "category", where), (prompt,))
        items.append(item)
    return items


def _question_item(entry: dict, shape: str, where: str) -> SuiteItem:
    """An MT-bench question ("turns") or a SPEED-Bench one ("messages": the user's turns)."""
    if "question_id" not in entry:
        raise SpecbenchError(f'{where}: missing "question_id"')
    question_id = entry["question_id"]
    if isinstance(question_id, bool) or not isinstance(question_id, (int, str)):
        raise SpecbenchError(f'{where}: "question_id" must be an integer or a string')
    turns = _messages(entry, where) if shape == "messages" else entry.get("turns")
    if turns is None:
        raise SpecbenchError(f'{where}: missing "{shape}"')
    if not isinstance(turns, list) or not turns or not all(isinstance(turn, str) and turn.strip() for turn in turns):
        raise SpecbenchError(f'{where}: "{shape}" must be a non-empty list of non-empty strings')
    if any(turn.startswith(UNFETCHED) for turn in turns):
        raise SpecbenchError(f"{where}: SPEED-Bench's turn is still a placeholder for data in its source dataset; "
                             "prepare the data with NeMo-Skills' speed-bench prepare.py, then --suite its output")
    category = _category(entry, "category", where)
    return SuiteItem(f"{category}-{question_id}", category, tuple(turns))


def _messages(entry: dict, where: str) -> list | None:
    """The user turns of a chat's messages (SPEED-Bench's prepared layout)."""
    messages = entry.get("messages")
    if messages is None:
        return None
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise SpecbenchError(f'{where}: "messages" must be a list of {{"role", "content"}} objects')
    return [m["content"] for m in messages if m.get("role", "user") == "user"]


def _as_object(entry: object, where: str) -> dict:
    if not isinstance(entry, dict):
        raise SpecbenchError(f"{where}: expected a JSON object, got {json.dumps(entry)[:40]}")
    return entry


def _required_text(entry: dict, key: str, where: str) -> str:
    if key not in entry:
        raise SpecbenchError(f'{where}: missing "{key}"')
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise SpecbenchError(f'{where}: "{key}" must be a non-empty string')
    return value


def _category(entry: dict, key: str, where: str) -> str:
    value = entry.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return UNCATEGORIZED
    if not isinstance(value, str):
        raise SpecbenchError(f'{where}: "{key}" must be a string')
    return value
