"""The README and the guide (docs/*.md) stay true as the code moves: every command they
show composes through the real parser (and a `python -c` one-liner runs), every Python
snippet runs (on a tiny model) or says what it needs, every relative link and image resolves, every table of figures
names the command that produced it, and the front page stays short."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from conf import CONF_DIR, Config, load_config
from conf.cli import check_overrides, options_first, prompt_from_words
from conf.sample_config import SampleConfig, load_sample_config
from conftest import training_overrides

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_WORDS = 2500

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NEEDS = re.compile(r"<!-- needs: (gpu|network) -->\s*$")
INLINE_COMMAND = re.compile(r"`((?:python|torchrun) [^`]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.*)$", re.M)
# A table reports measured figures when its header names a measured quantity.
MEASURED = re.compile(
    r"tok/s|tokens/s|ms/token|loss|MFU|seconds|wall time|bits/byte|prefill|RSS|agreement|uptraining|\bp\b"
)
# What a reader substitutes: <run>, $S, $(ls ...), HOST_OF_NODE_0.
PLACEHOLDER = re.compile(r"\$\([^)]*\)|\$\w+|<[^>]*>")
RELAUNCHED = ("train.py", "sample.py", "report.py", "export.py")


def relative(page: Path) -> str:
    return str(page.relative_to(REPO))


def blocks(page: Path, language: str) -> list[tuple[str, str | None]]:
    """The fenced blocks of `language` in page, each with what its marker says it needs."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) == language:
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            needs = NEEDS.search(before)
            found.append((match.group(2), needs.group(1) if needs else None))
    return found


def shell_lines(page: Path) -> list[str]:
    """Each command line of the page's bash blocks (continuations joined) and inline commands."""
    lines = []
    for body, _ in blocks(page, "bash"):
        lines += [line for line in body.replace("\\\n", " ").splitlines() if line.strip()]
    prose = FENCE.sub("", page.read_text())
    return lines + [" ".join(found.split()) for found in INLINE_COMMAND.findall(prose)]


def python_commands(line: str) -> list[list[str]]:
    """The argument lists after `python` (or after torchrun's options) in one shell line."""
    words = shlex.split(PLACEHOLDER.sub("x", line), comments=True)
    commands, current = [], None
    for word in words + ["|"]:
        if word in ("|", "&&", ";"):
            if current:
                commands.append(current)
            current = None
        elif current is not None:
            current.append(word)
        elif word == "python":
            current = []
        elif word in RELAUNCHED and words[0] == "torchrun":
            current = [word]
    return commands


def all_commands() -> list[tuple[str, list[str]]]:
    return [
        (relative(page), command) for page in PAGES for line in shell_lines(page) for command in python_commands(line)
    ]


def first_of_each_sweep(overrides: list[str]) -> list[str]:
    """A sweep's overrides with each swept value replaced by its first one (one job of it)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [
        f"{o.input_line.split('=', 1)[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else o.input_line
        for o in parsed
    ]


def compose_overrides(config_name: str, args: list[str]):
    """What train.py, sample.py or python prepare.py would run with `args`: checked by the
    same one-line check, composed by Hydra and validated into the dataclasses."""
    schema = Config if config_name == "train" else SampleConfig
    if config_name == "sample":
        args = prompt_from_words(args)
    args = options_first(args)
    try:
        check_overrides(args, schema, config_name)
    except SystemExit as refusal:
        pytest.fail(f"{args}: {refusal}")
    overrides = first_of_each_sweep([arg for arg in args if not arg.startswith("-")])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return load_config(cfg) if config_name == "train" else load_sample_config(cfg)


def parse_script_arguments(script: str, args: list[str], monkeypatch, tmp_path: Path) -> None:
    """report.py and export.py through their own argparse, with the work they would do recorded."""
    import export
    import report

    seen = []
    args = [str(tmp_path) if arg == "x" or arg.startswith("runs/") else arg for arg in args]
    if script == "report.py":
        monkeypatch.setattr(report, "write_report", lambda *a, **k: seen.append(a) or tmp_path / "report.md")
        report.main(args)
    else:
        monkeypatch.setattr(export, "find_checkpoint", lambda path, runs_root: seen.append(path) or path)
        monkeypatch.setattr(export, "export_checkpoint", lambda checkpoint, out_dir: seen.append(out_dir) or [])
        export.main(args)
    assert seen, f"{script} {args} did no work"


COMMANDS = all_commands()


def test_the_pages_show_commands_of_every_kind():
    kinds = {command[0] if command[0] != "-m" else f"-m {command[1]}" for _, command in COMMANDS}
    assert {"train.py", "sample.py", "report.py", "export.py", "prepare.py"} <= kinds


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}: {' '.join(c)[:60]}" for p, c in COMMANDS])
def test_every_command_composes_through_the_real_parser_or_runs(page, command, monkeypatch, tmp_path):
    script, args = command[0], command[1:]
    if script == "train.py":
        compose_overrides("train", args)
    elif script == "sample.py":
        compose_overrides("sample", args)
    elif script == "prepare.py":
        compose_overrides("train", args)
    elif script in ("report.py", "export.py"):
        parse_script_arguments(script, args, monkeypatch, tmp_path)
    elif script == "-m":
        module = command[1]
        assert module == "pytest" or (REPO / module / "__main__.py").is_file(), f"{page}: no module {module}"
    elif script == "-c":
        done = subprocess.run(
            [sys.executable, "-c", args[0]], cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{page}: python -c {args[0]!r}\n{done.stderr[-3000:]}"
    else:
        assert (REPO / script).is_file(), f"{page}: python {script}: no such file"


@pytest.mark.parametrize(
    "arg, message",
    [
        ("max_iter=5", "max_iter is not a setting"),
        ("model=foo", "no preset"),
    ],
)
def test_the_command_check_fails_on_a_broken_command(arg, message):
    with pytest.raises(pytest.fail.Exception, match=message):
        compose_overrides("train", [arg])


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings."""
    headings = HEADING.findall(FENCE.sub("", page.read_text()))
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in LINK.findall(FENCE.sub("", page.read_text()))
        if not re.match(r"https?:", target)
    ]


LINKS = links()


@pytest.mark.parametrize("page, target", LINKS, ids=[f"{relative(p)} -> {t}" for p, t in LINKS])
def test_every_relative_link_and_image_resolves(page, target):
    path, _, anchor = target.partition("#")
    destination = (page.parent / path).resolve() if path else page
    assert destination.exists(), f"{relative(page)}: {target} does not exist"
    if anchor:
        assert anchor in anchors(destination), f"{relative(page)}: {target}: no such heading"


def sections(page: Path) -> list[str]:
    """The page cut at its headings (those outside code blocks)."""
    text = page.read_text()
    code = [m.span() for m in FENCE.finditer(text)]
    cuts = [m.start() for m in HEADING.finditer(text) if not any(a <= m.start() < b for a, b in code)]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def figure_tables() -> list[tuple[Path, str, str]]:
    found = []
    for page in PAGES:
        for section in sections(page):
            for header in re.findall(r"^\|.*\|\n\|[-:| ]+\|$", section, re.M):
                if MEASURED.search(header.splitlines()[0]):
                    found.append((page, section, header.splitlines()[0]))
    return found


FIGURE_TABLES = figure_tables()


@pytest.mark.parametrize(
    "page, section, header", FIGURE_TABLES, ids=[f"{relative(p)}: {h[:50]}" for p, _, h in FIGURE_TABLES]
)
def test_every_table_of_figures_names_the_command_that_produced_it(page, section, header):
    in_a_block = any(
        re.search(r"^(python|torchrun) ", block.group(2), re.M)
        for block in FENCE.finditer(section)
        if block.group(1) == "bash"
    )
    in_the_text = INLINE_COMMAND.search(FENCE.sub("", section))
    assert in_a_block or in_the_text, f"{relative(page)}: the table {header!r} names no command"


def test_the_front_page_is_short():
    words = len((REPO / "README.md").read_text().split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words; the front page holds at most {README_MAX_WORDS}"


def snippets() -> list[tuple[Path, str, str | None]]:
    return [(page, body, needs) for page in PAGES for body, needs in blocks(page, "python")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory holding what the snippets read: a tiny trained run under runs/, its
    export at hf/my-model, and a small input.txt."""
    directory = tmp_path_factory.mktemp("snippets")
    # No data/ folder there: it would shadow gptlab's data package, as the guide warns.
    kept = ("data.tokenizer=", "runs_root=", "data.data_dir=")
    overrides = [o for o in training_overrides(directory) if not o.startswith(kept)]
    overrides += ["max_iters=10", "runs_root=runs", "data.data_dir=data_cache/corpus"]
    run(directory, "train.py", *overrides)
    run(directory, "export.py", str(next((directory / "runs").iterdir())), "hf/my-model")
    (directory / "input.txt").write_text((directory / "corpus.txt").read_text())
    return directory


def run(directory: Path, script: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / script), *args], cwd=directory, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]


SNIPPETS = snippets()


@pytest.mark.parametrize(
    "page, body, needs", SNIPPETS, ids=[f"{relative(p)}: {b.splitlines()[0][:40]}" for p, b, _ in SNIPPETS]
)
def test_every_python_snippet_runs_or_says_what_it_needs(page, body, needs, workdir):
    if needs:
        pytest.skip(f"needs {needs}")
    done = subprocess.run([sys.executable, "-c", body], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{relative(page)}:\n{body}\n{done.stderr[-3000:]}"
