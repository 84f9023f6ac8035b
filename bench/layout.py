"""The codebase's layout, measured: how far a reader jumps between files to follow a run,
which packages import which, and how the lines are spread over the packages.

    python bench/layout.py                                   # this checkout
    python bench/layout.py --repo /tmp/old --json old.json   # another checkout (same python)

1. The path a reader follows: train.py from its main() to the first optimizer step (on data
   an earlier run prepared, and preparing it afresh), and sample.py from its main() to the
   first generated token (the first yield of model/'s `stream` generator), each traced with
   sys.setprofile in a subprocess run in the measured checkout: a tiny CPU run, on this
   file's text unless --corpus. Only functions in the checkout's own files count (not
   site-packages, tests/ or bench/; module bodies run by an import are not a step of the
   story; only the main thread). A stop is the first entry into a function from another
   file than the innermost checkout frame below it (a reader reads a function once, however
   often a loop calls it); a return is a stop into a file already visited (the script
   itself counts as visited), so stops = files - 1 + returns.
2. Import arrows: every import (at a module's top or in a function) in the packages (top-level
   directories with __init__.py) and top-level modules; tests/ and bench/ import but are not
   counted as importers. Arrows unit -> unit, cycles among units and among model/'s modules,
   and upward imports: a package importing a script (a top-level file with a __main__ guard).
3. Non-blank lines per package and top-level module, and every tracked .py file over 400 lines.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.metadata
import json
import os
import platform
import runpy
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve()  # any text will do: the path does not depend on it, and this file is at hand
LONG_FILE = 400  # lines
NOT_ON_THE_PATH = ("tests", "bench")  # the tracer itself lives in bench/
TOP_RETURNS = 5


# 1. The path a reader follows -------------------------------------------------------------


class PathCounter:
    """Stops and returns along one path, from the calls made: (caller file, callee file, callee
    function). A reader reads each function once, so only a function's first entry from another
    file is a stop; every entry from another file is a call."""

    def __init__(self, start_file: str) -> None:
        self.visited = [start_file]
        self.read: set[str] = set()
        self.stops: list[str] = []  # "caller file -> callee function", in order
        self.returns: Counter[str] = Counter()
        self.calls = 0

    def enter(self, caller: str | None, callee: str, function: str) -> None:
        first_read = function not in self.read
        self.read.add(function)  # read in place when its own file calls it
        if caller is None or caller == callee:
            return
        self.calls += 1
        if not first_read:
            return
        self.stops.append(f"{caller} -> {function}")
        if callee in self.visited:
            self.returns[callee] += 1
        else:
            self.visited.append(callee)

    def summary(self) -> dict:
        return {
            "stops": len(self.stops),
            "files": len(self.visited),
            "returns": sum(self.returns.values()),
            "calls": self.calls,
            "top_returns": self.returns.most_common(TOP_RETURNS),
            "files_in_order": self.visited,
            "stops_in_order": self.stops,
        }


def file_namer(repo: Path):
    """filename -> its path in the repo ('run/start.py'), or None for a file off the path."""
    root, names = os.path.realpath(repo) + os.sep, {}

    def name(filename: str) -> str | None:
        if filename not in names:
            real = os.path.realpath(filename)  # "<string>", "<frozen abc>": no file, not on the path
            rel = real[len(root) :] if os.path.isabs(filename) and real.startswith(root) else None
            names[filename] = None if rel is None or rel.split(os.sep)[0] in NOT_ON_THE_PATH else rel
        return names[filename]

    return name


def nearest_repo_file(frame, name) -> str | None:
    """The file of the innermost frame, from `frame` outwards, that is in the repo."""
    while frame is not None:
        found = name(frame.f_code.co_filename)
        if found:
            return found
        frame = frame.f_back
    return None


def trace_child(repo: Path, which: str, out: Path, overrides: list[str]) -> None:
    """In the subprocess: run train.py or sample.py as __main__ under a profiler, write the
    path to `out` at the first optimizer step (train) or first token (sample), and exit."""
    # The scripts import torch first thing too; here, to hook every optimizer's step.
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    sys.path[0] = str(repo)  # the checkout measured, not bench/'s own directory
    script = f"{which}.py"
    name, counter, started = file_namer(repo), PathCounter(script), [False]

    def finish(*_) -> None:
        sys.setprofile(None)
        modules = {m: sys.modules[m].__file__ for m in ("model", "data", "conf", "training") if m in sys.modules}
        loaded_training = sorted(m for m in sys.modules if m.split(".")[0] == "training")
        out.write_text(json.dumps({**counter.summary(), "modules": modules, "training_loaded": loaded_training}))
        os._exit(0)

    def profile(frame, event, arg) -> None:
        code = frame.f_code
        if event == "call" and code.co_name != "<module>" and name(code.co_filename):
            if started[0]:
                callee = name(code.co_filename)
                counter.enter(
                    nearest_repo_file(frame.f_back, name), callee, f"{callee}:{code.co_firstlineno} {code.co_name}"
                )
            started[0] = started[0] or (code.co_name == "main" and name(code.co_filename) == script)
        elif (
            event == "return"
            and which == "sample"
            and started[0]
            and code.co_name == "stream"
            and (name(code.co_filename) or "").startswith("model" + os.sep)
        ):
            finish()  # the generator's first yield: the first token

    register_optimizer_step_pre_hook(finish)
    sys.argv = [str(repo / script), *overrides]
    sys.setprofile(profile)
    runpy.run_path(str(repo / script), run_name="__main__")
    raise SystemExit(f"{script} ended before its first {'step' if which == 'train' else 'token'}")


def tiny_run(corpus: Path, directory: Path) -> list[str]:
    """Overrides both checkouts accept for a one-step CPU run writing under `directory`."""
    return [
        "model=nano",
        "model.block_size=32",
        "data=files",
        f"data.path={corpus}",
        "data.tokenizer=char",
        f"data.data_dir={directory / 'data'}",
        "data.num_proc=1",
        f"runs_root={directory / 'runs'}",
        "batch_size=4",
        "max_iters=1",
        "eval_interval=1",
        "eval_iters=1",
        "logging.progress=false",
        "logging.peak_flops=1e12",
        "device=cpu",
        "recipe=gpt2",
    ]


def child_env(repo: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}


def traced(repo: Path, which: str, overrides: list[str], out: Path) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        which,
        str(out),
        "--repo",
        str(repo),
        "--",
        *overrides,
    ]
    done = subprocess.run(command, cwd=repo, env=child_env(repo), capture_output=True, text=True)
    if not out.exists():
        raise RuntimeError(f"tracing {which}.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
    path = json.loads(out.read_text())
    strays = [f for f in path["modules"].values() if not Path(f).resolve().is_relative_to(repo.resolve())]
    if strays:
        raise RuntimeError(f"{which}.py imported another checkout's modules: {strays}")
    return path


def reader_paths(repo: Path, corpus: Path) -> dict:
    """Three paths, after an untraced one-step run: train.py on the data that run prepared (a
    run's story), train.py preparing its data afresh (a first run's), and sample.py on that
    run's checkpoint."""
    with tempfile.TemporaryDirectory(prefix="layout_") as tmp:
        tmp = Path(tmp)
        first = tiny_run(corpus, tmp / "first")
        subprocess.run(
            [sys.executable, "train.py", *first], cwd=repo, env=child_env(repo), check=True, capture_output=True
        )
        prepared = [o for o in first if not o.startswith("runs_root=")] + [f"runs_root={tmp / 'again'}"]
        paths = {
            "train": traced(repo, "train", prepared, tmp / "train.json"),
            "train_preparing": traced(repo, "train", tiny_run(corpus, tmp / "fresh"), tmp / "fresh.json"),
            "sample": traced(
                repo,
                "sample",
                [f"runs_root={tmp / 'first' / 'runs'}", "max_new_tokens=4", "device=cpu", "prompt=ROMEO", "json=true"],
                tmp / "sample.json",
            ),
        }
    sample = paths["sample"]
    sample["enters_training"] = any(f.split(os.sep)[0] == "training" for f in sample["files_in_order"])
    return paths


# 2. Import arrows --------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    source: str  # dotted module names, both in the repo
    target: str
    site: str  # path:line
    in_function: bool


def tracked_py(repo: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--", "*.py"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(path for path in listed.split("\0") if path)


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(tree: ast.AST):
    """(import node, whether it sits inside a function) for every import in the tree."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack += [(child, in_function) for child in ast.iter_child_nodes(node)]


def imported_names(node: ast.Import | ast.ImportFrom, path: str, modules: set[str]) -> list[str]:
    """The repo modules an import names: `from a import b` is a.b when that is a module, else a."""
    if isinstance(node, ast.Import):
        found = [max((p for p in prefixes(alias.name) if p in modules), key=len, default=None) for alias in node.names]
        return [name for name in found if name]
    base = module_name(path).split(".")
    if node.level:
        base = base[: len(base) - node.level + (path.endswith("__init__.py"))]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return sorted(name for name in found if name in modules)


def prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def repo_imports(repo: Path, paths: list[str]) -> list[Import]:
    modules = {module_name(path) for path in paths}
    found = []
    for path in paths:
        tree = ast.parse((repo / path).read_text(encoding="utf-8"), path)
        for node, in_function in import_nodes(tree):
            found += [
                Import(module_name(path), target, f"{path}:{node.lineno}", in_function)
                for target in imported_names(node, path, modules)
                if target != module_name(path)
            ]
    return sorted(found, key=lambda imp: (imp.source, imp.target, imp.site))


def has_main_guard(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        for node in tree.body
    )


def cycles(arrows: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (every cycle lies in one)."""
    nodes = sorted({node for arrow in arrows for node in arrow})
    index = {node: i for i, node in enumerate(nodes)}
    graph = coo_matrix(
        ([1] * len(arrows), ([index[s] for s, _ in arrows], [index[t] for _, t in arrows])),
        shape=(len(nodes), len(nodes)),
    )
    _, labels = connected_components(graph, connection="strong")
    components = {label: [node for node, mine in zip(nodes, labels) if mine == label] for label in set(labels)}
    return sorted(members for members in components.values() if len(members) > 1)


def arrows_with_sites(imports: list[Import], key) -> dict[tuple[str, str], list[str]]:
    """(source, target) under `key` -> the import sites behind it ('path:line', '(fn)' inside a function)."""
    found: dict[tuple[str, str], list[str]] = {}
    for imp in imports:
        source, target = key(imp.source), key(imp.target)
        if source is not None and target is not None and source != target:
            found.setdefault((source, target), []).append(imp.site + (" (fn)" if imp.in_function else ""))
    return found


def import_figures(repo: Path) -> dict:
    paths = tracked_py(repo)
    imports = repo_imports(repo, paths)
    packages = sorted(
        Path(p).parent.name
        for p in paths
        if Path(p).parent.parent == Path(".")
        and Path(p).name == "__init__.py"
        and Path(p).parent.name not in NOT_ON_THE_PATH
    )
    top_modules = sorted(Path(p).stem for p in paths if "/" not in p)
    scripts = sorted(stem for stem in top_modules if has_main_guard(repo / f"{stem}.py"))
    units = set(packages) | set(top_modules)
    unit_arrows = {
        arrow: sites
        for arrow, sites in arrows_with_sites(imports, lambda m: m.split(".")[0]).items()
        if arrow[0] in units
    }
    in_model = arrows_with_sites(imports, lambda m: m if m.split(".")[0] == "model" else None)
    upward = [
        f"{site} imports {target}.py"
        for (source, target), sites in unit_arrows.items()
        if source in packages and target in scripts
        for site in sites
    ]
    return {
        "packages": packages,
        "top_level_modules": top_modules,
        "scripts": scripts,
        "arrows": len(unit_arrows),
        "package_arrows": sum(1 for s, t in unit_arrows if s in packages and t in packages),
        "arrow_list": {f"{s} -> {t}": sites for (s, t), sites in sorted(unit_arrows.items())},
        "cycles": [cycle_detail(c, unit_arrows) for c in cycles(set(unit_arrows))],
        "model_cycles": [cycle_detail(c, in_model) for c in cycles(set(in_model))],
        "upward": sorted(upward),
    }


def cycle_detail(component: list[str], arrows: dict[tuple[str, str], list[str]]) -> dict:
    inside = {f"{s} -> {t}": sites for (s, t), sites in sorted(arrows.items()) if s in component and t in component}
    return {"members": component, "arrows": inside}


# 3. Lines ----------------------------------------------------------------------------------


def line_figures(repo: Path) -> dict:
    """Non-blank lines per package ('model/') or top-level file, and files over LONG_FILE lines."""
    per_unit: Counter[str] = Counter()
    long_files = {}
    for path in tracked_py(repo):
        lines = (repo / path).read_text(encoding="utf-8").splitlines()
        parts = Path(path).parts
        per_unit[parts[0] + "/" if len(parts) > 1 else path] += sum(1 for line in lines if line.strip())
        if len(lines) > LONG_FILE:
            long_files[path] = len(lines)
    return {
        "non_blank": dict(sorted(per_unit.items())),
        "long_files": dict(sorted(long_files.items(), key=lambda item: -item[1])),
    }


# The report --------------------------------------------------------------------------------


def measure(repo: Path, corpus: Path) -> dict:
    git = ["git", "-C", str(repo)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = bool(
        subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    return {
        "repo": str(repo),
        "commit": commit,
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "paths": reader_paths(repo, corpus),
        "imports": import_figures(repo),
        "lines": line_figures(repo),
    }


PATHS = {
    "train": "its first optimizer step, on prepared data",
    "train_preparing": "its first optimizer step, preparing the data",
    "sample": "its first token",
}


def report(m: dict) -> str:
    out = [
        f"{m['repo']} at {m['commit'][:7]}{' (with uncommitted changes)' if m['dirty'] else ''}, "
        f"measured {m['date']} with Python {m['python']} and torch {m['torch']}",
        "",
    ]
    for which, end in PATHS.items():
        p = m["paths"][which]
        tops = ", ".join(f"{f} {n}" for f, n in p["top_returns"]) or "none"
        out.append(
            f"{which.split('_')[0]}.py main() to {end}: {p['stops']} stops in {p['files']} files, "
            f"{p['returns']} returns (most: {tops}); {p['calls']} calls from file to file in all"
        )
    sample = m["paths"]["sample"]
    out.append(
        f"sample.py enters training/: {'yes' if sample['enters_training'] else 'no'} "
        f"(training modules imported: {', '.join(sample['training_loaded']) or 'none'})"
    )
    imp = m["imports"]
    out += [
        "",
        f"import arrows: {imp['arrows']} between packages and top-level modules, "
        f"{imp['package_arrows']} package -> package",
    ]
    for name, found in (
        ("cycles among packages and top-level modules", imp["cycles"]),
        ("cycles among model/'s modules", imp["model_cycles"]),
    ):
        out.append(f"{name}: {len(found) or 'none'}")
        out += [
            f"  {' / '.join(c['members'])}: "
            + "; ".join(f"{a} ({sites[0]}{', ...' if len(sites) > 1 else ''})" for a, sites in c["arrows"].items())
            for c in found
        ]
    out.append(f"upward imports (a package importing a script): {len(imp['upward']) or 'none'}")
    out += [f"  {line}" for line in imp["upward"]]
    out += ["", "non-blank lines:"] + [f"  {unit:<16} {n:>6,}" for unit, n in m["lines"]["non_blank"].items()]
    out += [f"files over {LONG_FILE} lines: {len(m['lines']['long_files']) or 'none'}"]
    out += [f"  {path} {n}" for path, n in m["lines"]["long_files"].items()]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout measured (default: this one)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the text the tiny runs train on")
    parser.add_argument("--child", nargs=2, metavar=("SCRIPT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repo = args.repo.resolve()
    if args.child:
        trace_child(repo, args.child[0], Path(args.child[1]), args.overrides)
    figures = measure(repo, args.corpus.resolve())
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
