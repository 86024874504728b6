"""core/files.py: atomic writes leave the old file or the new one, never a torn one; readers fail in one line."""

import math

import pytest

from specbench.core.errors import SpecbenchError
from specbench.core.files import (
    atomic_path,
    read_json,
    read_json_object,
    read_jsonl,
    read_toml,
    write_atomic,
    write_json,
)


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"speedup": 1.5})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text('{"speedup": ')
            raise RuntimeError("interrupted")
    assert read_json(path, "summary") == {"speedup": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_directory_is_replaced_whole(tmp_path):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / "old.bin").write_text("old")
    with atomic_path(out) as staging:
        staging.mkdir()
        (staging / "config.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["drafter"]


def test_the_temporary_name_keeps_the_suffix(tmp_path):
    with atomic_path(tmp_path / "plot.png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path and tmp.name != "plot.png"
        tmp.write_bytes(b"png")
    assert (tmp_path / "plot.png").read_bytes() == b"png"


def test_json_is_strict(tmp_path):
    write_json(tmp_path / "a.json", {"ratio": math.nan, "inf": math.inf})
    assert "NaN" not in (tmp_path / "a.json").read_text()
    assert read_json(tmp_path / "a.json", "ratios") == {"ratio": None, "inf": None}


@pytest.mark.parametrize("content, reader, needle", [
    (None, read_json, "run metadata {path} does not exist"),
    (b"\xff\xfe", read_json, "is not a JSON text file"),
    ('{"status": ', read_json, "is not valid JSON"),
    (b"\x00\xff", read_toml, "is not a TOML text file"),
    ("[profiles.x\n", read_toml, "is not valid TOML"),
])
def test_readers_fail_in_one_line_naming_the_file(tmp_path, content, reader, needle):
    path = tmp_path / "file"
    if content is not None:
        write_atomic(path, content) if isinstance(content, str) else path.write_bytes(content)
    with pytest.raises(SpecbenchError) as raised:
        reader(path, "run metadata")
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and needle.format(path=path) in message


def test_json_lines_drop_only_a_cut_off_last_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": ')
    assert read_jsonl(path, "rows", cut_tail=True) == ([{"a": 1}, {"a": 2}], True)
    with pytest.raises(SpecbenchError, match=r"rows .*rows.jsonl line 4 is not valid JSON"):
        read_jsonl(path, "rows")
    path.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')  # damaged mid-file: not an interruption
    with pytest.raises(SpecbenchError, match="line 2 is not valid JSON"):
        read_jsonl(path, "rows", cut_tail=True)
    path.write_text("[1]\n")
    assert read_jsonl(path, "rows") == ([[1]], False)
    with pytest.raises(SpecbenchError, match="must hold a JSON object"):
        read_json_object(path, "rows")
