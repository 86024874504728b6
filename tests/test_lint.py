"""The code lints clean under pyproject.toml's ruff rules, so that a name used where it was never imported fails
here, not on the one command path that reaches it."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(root: Path, *paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *paths], cwd=root,
                          capture_output=True, text=True, timeout=300)


def test_the_code_lints_clean():
    result = ruff(ROOT, "specbench", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_undefined_name_fails_the_lint(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "frames.py").write_text("def kept(rows):\n    return [r for r in rows if absorbed(r) == 1]\n")
    result = ruff(tmp_path, "frames.py")
    assert result.returncode == 1 and "F821" in result.stdout
