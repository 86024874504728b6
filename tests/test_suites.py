import json
import re
from pathlib import Path

import pytest

from specbench.core.errors import SpecbenchError
from specbench.plan.suites import Suite, SuiteItem, builtin_suite_names, load_suite, select, suites_dir

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SPECBENCH_CATEGORIES = [
    "chat", "code", "creative", "extraction", "high_precision", "math", "summarization", "translation",
]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not available")
    return path


# built-in suite

def test_builtin_suite_has_eight_categories_of_twelve():
    suite = load_suite("specbench")
    assert suite.name == "specbench"
    assert suite.categories() == {category: 12 for category in SPECBENCH_CATEGORIES}
    assert len({item.id for item in suite.items}) == 96
    assert all(len(item.turns) == 1 and len(item.turns[0]) <= 600 for item in suite.items)


def test_default_is_an_alias_of_specbench():
    assert load_suite("default") == load_suite("specbench")
    assert "specbench" in builtin_suite_names()


def test_builtin_suite_ids_name_suite_category_and_rank():
    items = load_suite("default").items
    assert [item.id for item in items[:2]] == ["specbench-code-1", "specbench-code-2"]


def test_builtin_suite_loads_by_path():
    assert load_suite(suites_dir() / "specbench.json") == load_suite("specbench")


def test_unknown_builtin_name_lists_known_names():
    with pytest.raises(SpecbenchError, match=r"unknown suite 'nope'.*default, .*specbench"):
        load_suite("nope")


# select

def test_select_by_category_keeps_order():
    suite = load_suite("specbench")
    selected = select(suite, categories=["math", "code"])
    assert selected.categories() == {"code": 12, "math": 12}
    assert [item.category for item in selected.items] == ["code"] * 12 + ["math"] * 12


def test_select_small_limit_covers_every_category():
    selected = select(load_suite("specbench"), limit=8)
    assert list(selected.categories().values()) == [1] * 8
    assert [item.id.rsplit("-", 1)[1] for item in selected.items] == ["1"] * 8


def test_select_limit_goes_round_robin_in_suite_order():
    items = tuple(SuiteItem(str(n), category, ("p",)) for n, category in enumerate("aaaabbc"))
    selected = select(Suite("s", items), limit=5)
    assert [item.id for item in selected.items] == ["0", "1", "4", "5", "6"]


def test_select_limit_after_category_filter():
    selected = select(load_suite("specbench"), categories=["chat", "math"], limit=3)
    assert selected.categories() == {"chat": 1, "math": 2}
    assert select(load_suite("specbench"), categories=["chat"], limit=500).categories() == {"chat": 12}


def test_select_without_arguments_returns_everything():
    suite = load_suite("specbench")
    assert select(suite) == suite


def test_select_unknown_category_lists_valid_ones():
    with pytest.raises(SpecbenchError, match="unknown category 'poetry'.*valid: chat, code, creative"):
        select(load_suite("specbench"), categories=["code", "poetry"])


@pytest.mark.parametrize("limit", [0, -3])
def test_select_limit_below_one_is_an_error(limit):
    with pytest.raises(SpecbenchError, match="limit must be at least 1"):
        select(load_suite("specbench"), limit=limit)


def test_select_from_empty_suite_is_an_error():
    with pytest.raises(SpecbenchError, match="no prompts selected"):
        select(Suite("empty", ()))


# formats

def test_alpaca_eval_json(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([
        {"instruction": "Say hi.", "output": "Hi", "generator": "x", "dataset": "chat"},
        {"instruction": "Add 2 and 2."},
        {"instruction": "Say bye.", "dataset": "chat"},
    ]))
    suite = load_suite(path)
    assert suite.name == "mine"
    assert suite.items == (
        SuiteItem("mine-chat-1", "chat", ("Say hi.",)),
        SuiteItem("mine-uncategorized-1", "uncategorized", ("Add 2 and 2.",)),
        SuiteItem("mine-chat-2", "chat", ("Say bye.",)),
    )


def test_spec_bench_question_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "mt_bench", "turns": ["Write a poem.", "Make it shorter."]},
        {"question_id": 161, "category": "translation", "turns": ["Translate: Guten Morgen."]},
        {"question_id": 241, "category": "math_reasoning", "turns": ["What is 7 * 6?"]},
        {"question_id": 321, "category": "rag", "turns": ["Given the passage, answer."]},
    ])
    suite = load_suite(str(path))
    assert [item.id for item in suite.items] == ["mt_bench-81", "translation-161", "math_reasoning-241", "rag-321"]
    assert suite.items[0].turns == ("Write a poem.", "Make it shorter.")
    assert suite.categories() == {"math_reasoning": 1, "mt_bench": 1, "rag": 1, "translation": 1}


def test_plain_jsonl_ids_are_line_numbers(tmp_path):
    path = write(tmp_path / "plain.jsonl", '{"prompt": "one", "category": "a"}\n\n{"prompt": "two"}\n')
    suite = load_suite(path)
    assert suite.items == (SuiteItem("1", "a", ("one",)), SuiteItem("3", "uncategorized", ("two",)))


def test_jsonl_content_in_a_json_file(tmp_path):
    path = write(tmp_path / "lines.json", '{"prompt": "one"}\n{"prompt": "two"}\n')
    assert len(load_suite(path).items) == 2


def test_format_detected_from_content_without_extension(tmp_path):
    path = write(tmp_path / "prompts.txt", json.dumps([{"instruction": "Hi."}]))
    assert load_suite(path).items[0].turns == ("Hi.",)


def test_bare_name_of_an_existing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "myprompts", '{"prompt": "one"}\n')
    assert load_suite("myprompts").name == "myprompts"


# SPEED-Bench, as NeMo-Skills' speed-bench prepare.py writes it (the layout `vllm bench serve` reads)

def speed_bench_row(question_id: str, category: str, *turns: str, **fields) -> dict:
    """One line of a prepared split: the dataset card's fields, the turns as user messages."""
    return {"question_id": question_id, "category": category, "sub_category": fields.get("sub_category", ""),
            "source": fields.get("source", "mock"), "src_id": fields.get("src_id", ""),
            "difficulty": fields.get("difficulty", "medium"), "multiturn": len(turns) > 1,
            "messages": [{"role": "user", "content": turn} for turn in turns]}


def write_speed_bench(root: Path) -> Path:
    root.mkdir()
    write_jsonl(root / "qualitative.jsonl", [
        speed_bench_row("a1f3", "coding", "Write a Python function that reverses a list."),
        speed_bench_row("b2c4", "roleplay", "You are a ship's cook. Greet the crew.", "Now tell them dinner is late."),
        speed_bench_row("c9d0", "writing", "Write a haiku about rain."),
        speed_bench_row("d7e1", "coding", "Explain what a Python decorator does."),
    ])
    write_jsonl(root / "throughput_1k.jsonl", [
        speed_bench_row("e5f6", "low_entropy", "Copy the text below.\n" + "lorem ipsum " * 40),
        speed_bench_row("f0a1", "high_entropy", "Continue the story.\n" + "once upon a time " * 30),
    ])
    return root


def test_speed_bench_directory_is_its_qualitative_split(tmp_path):
    suite = load_suite(write_speed_bench(tmp_path / "speed-bench"))
    assert suite.name == "speed-bench-qualitative"
    assert suite.categories() == {"coding": 2, "roleplay": 1, "writing": 1}
    assert suite.items[0] == SuiteItem("coding-a1f3", "coding", ("Write a Python function that reverses a list.",))
    assert suite.items[1].turns == ("You are a ship's cook. Greet the crew.", "Now tell them dinner is late.")
    assert [item.id for item in select(suite, ["coding"]).items] == ["coding-a1f3", "coding-d7e1"]


def test_speed_bench_throughput_split_by_its_file(tmp_path):
    suite = load_suite(write_speed_bench(tmp_path / "speed-bench") / "throughput_1k.jsonl")
    assert suite.name == "throughput_1k" and suite.categories() == {"high_entropy": 1, "low_entropy": 1}


def test_speed_bench_turns_not_yet_fetched_from_their_source_are_refused(tmp_path):
    """The published parquet leaves some turns to be fetched from their source datasets."""
    placeholder = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH\n\n{article}"
    path = write_jsonl(tmp_path / "qualitative.jsonl", [speed_bench_row("a", "summarization", placeholder)])
    with pytest.raises(SpecbenchError, match=r"line 1: SPEED-Bench's turn is still a placeholder.*prepare.py"):
        load_suite(path)
    raw = write_jsonl(tmp_path / "raw.jsonl",
                      [{"question_id": "a", "category": "summarization", "turns": [placeholder]}])
    with pytest.raises(SpecbenchError, match="placeholder"):
        load_suite(raw)


@pytest.mark.parametrize(("line", "message"), [
    ({"question_id": "a", "category": "qa", "messages": "hi"}, r'"messages" must be a list of'),
    ({"question_id": "a", "category": "qa", "messages": [{"role": "system", "content": "x"}]},
     r'"messages" must be a non-empty list'),
    ({"category": "qa", "messages": [{"role": "user", "content": "x"}]}, r'missing "question_id"'),
])
def test_malformed_speed_bench_lines(tmp_path, line, message):
    path = write_jsonl(tmp_path / "qualitative.jsonl", [line])
    with pytest.raises(SpecbenchError, match=rf"line 1: {message}"):
        load_suite(path)


# malformed input: every message names the file and the line or entry

@pytest.mark.parametrize(("text", "message"), [
    ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": \n', r"line 3: not valid JSON"),
    ('{"prompt": "a"}\n{"category": "x"}\n', r'line 2: missing "prompt"'),
    ('{"prompt": ""}\n', r'line 1: "prompt" must be a non-empty string'),
    ('{"prompt": 5}\n', r'line 1: "prompt" must be a non-empty string'),
    ('{"prompt": "a", "category": 3}\n', r'line 1: "category" must be a string'),
    ('{"prompt": "a"}\n[1, 2]\n', r"line 2: expected a JSON object"),
    ('{"question_id": 1, "category": "c", "turns": ["a"]}\n{"question_id": 2, "category": "c"}\n',
     r'line 2: missing "turns"'),
    ('{"category": "c", "turns": ["a"]}\n', r'line 1: missing "question_id"'),
    ('{"question_id": 1, "turns": []}\n', r'line 1: "turns" must be a non-empty list'),
    ('{"question_id": 1, "turns": ["a", 2]}\n', r'line 1: "turns" must be a non-empty list'),
    ('{"question_id": true, "turns": ["a"]}\n', r'line 1: "question_id" must be an integer or a string'),
    ('{"question_id": 7, "turns": ["a"]}\n{"question_id": 7, "turns": ["b"]}\n', r"line 2: duplicate question_id 7"),
])
def test_malformed_jsonl(tmp_path, text, message):
    path = write(tmp_path / "x.jsonl", text)
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(str(path))} {message}"):
        load_suite(path)


@pytest.mark.parametrize(("text", "message"), [
    ('[{"instruction": "a"},\n {"instruction": "b"}\n {"instruction": "c"}]', r"line 3: not valid JSON"),
    ('[{"instruction": "a"}, {"dataset": "x"}]', r'entry \[1\]: missing "instruction"'),
    ('[{"instruction": "a"}, {"instruction": "  "}]', r'entry \[1\]: "instruction" must be a non-empty string'),
    ('[{"instruction": "a"}, "b"]', r'entry \[1\]: expected a JSON object, got "b"'),
    ('[{"instruction": "a", "dataset": ["x"]}]', r'entry \[0\]: "dataset" must be a string'),
])
def test_malformed_alpaca_eval_json(tmp_path, text, message):
    path = write(tmp_path / "x.json", text)
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(str(path))} {message}"):
        load_suite(path)


def test_json_file_holding_one_object_is_an_error(tmp_path):
    path = write(tmp_path / "x.json", '{\n  "instruction": "a"\n}\n')
    with pytest.raises(SpecbenchError, match="x.json: expected a JSON list of objects"):
        load_suite(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecbenchError, match="suite file .* does not exist"):
        load_suite(tmp_path / "absent.json")


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_file(tmp_path, text):
    with pytest.raises(SpecbenchError, match="x.jsonl: file is empty"):
        load_suite(write(tmp_path / "x.jsonl", text))


def test_empty_json_list(tmp_path):
    with pytest.raises(SpecbenchError, match="no prompts in file"):
        load_suite(write(tmp_path / "x.json", "[]"))


def test_directory_and_binary_files_are_errors(tmp_path):
    with pytest.raises(SpecbenchError, match="is a directory without qualitative.jsonl"):
        load_suite(tmp_path)
    (tmp_path / "x.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecbenchError, match="not UTF-8"):
        load_suite(tmp_path / "x.jsonl")


# the real files in ../shared/data

def test_real_alpaca_eval_outputs():
    suite = load_suite(shared_file("alpaca_eval_outputs.json"))
    assert len(suite.items) == 805
    rows = json.loads(shared_file("alpaca_eval_outputs.json").read_text(encoding="utf-8"))
    assert [item.category for item in suite.items] == [row["dataset"] for row in rows]
    assert set(suite.categories()) == {"helpful_base", "koala", "oasst", "selfinstruct", "vicuna"}
    assert len({item.id for item in suite.items}) == 805


def test_real_mt_bench_questions():
    suite = load_suite(shared_file("mt_bench_question.jsonl"))
    assert len(suite.items) == 80
    assert all(len(item.turns) == 2 for item in suite.items)
    assert suite.categories() == {
        category: 10
        for category in ["coding", "extraction", "humanities", "math", "reasoning", "roleplay", "stem", "writing"]
    }
    assert suite.items[0].id == "writing-81"
    assert len(select(suite, limit=8).categories()) == 8
