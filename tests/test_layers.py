"""The package graph is one-way and has no circle: import-linter checks pyproject.toml's contracts
(docs/architecture.md); and no two modules share a name."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
# every module of core/, then what heavy libraries that loaded
LOAD_CORE = """import importlib, pkgutil, sys
import specbench.core as core
for module in pkgutil.iter_modules(core.__path__):
    importlib.import_module(f"specbench.core.{module.name}")
print(sorted({name.split(".")[0] for name in sys.modules} & {"torch", "transformers", "numpy", "pandas"}))"""


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the specbench package under `root` (its directory goes first on sys.path)."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True, timeout=300)


def test_specbench_imports_only_downwards():
    result = lint_imports(ROOT)
    why = result.stdout + result.stderr
    assert result.returncode == 0, f"an import goes up a layer (pyproject.toml [tool.importlinter]):\n{why}"


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "specbench", tmp_path / "specbench", ignore=shutil.ignore_patterns("__pycache__"))
    records = tmp_path / "specbench" / "core" / "records" / "run_records.py"
    records.write_text(records.read_text() + "\nfrom specbench.report.run_dir import read_run  # noqa: E402\n")

    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "specbench.core is not allowed to import specbench.report" in result.stdout
    assert "specbench.core.records.run_records -> specbench.report.run_dir" in result.stdout


def test_a_circle_inside_a_package_breaks_the_contract_even_deferred(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "specbench", tmp_path / "specbench", ignore=shutil.ignore_patterns("__pycache__"))
    stats = tmp_path / "specbench" / "analysis" / "noise.py"
    stats.write_text(stats.read_text() + "\n\ndef _later():\n    from specbench.analysis import stats  # noqa: F401\n")
    uses = tmp_path / "specbench" / "analysis" / "stats.py"
    uses.write_text(uses.read_text() + "\n\ndef _later():\n    from specbench.analysis import noise  # noqa: F401\n")

    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "No cycles are allowed in specbench.analysis" in result.stdout


def test_no_two_modules_share_a_name():
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "specbench").rglob("*.py")):
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def test_commands_stay_thin():
    """A command parses, calls the library and prints: none of cli/'s functions runs past 60 lines."""
    long = [f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted((ROOT / "specbench" / "cli").glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]
    assert long == []


def test_core_loads_without_torch():
    loaded = subprocess.run([sys.executable, "-c", LOAD_CORE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"
