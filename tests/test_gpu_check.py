"""The GPU acceptance run cannot rot between GPU runs: its --smoke mode runs every stage
on the CPU at tiny sizes, through the same code; a failure in one variant or decode mode
leaves the other rows' figures on disk, and a budget too short skips stages cleanly."""

import ast
import json
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import torch
from packaging.utils import canonicalize_name

from bench.gpu_report import render

REPO = Path(__file__).resolve().parents[1]
STAGES = ["environment", "throughput", "memory", "decode", "train", "cuda_tests"]  # the order they run in
# and last, when time is left: time_to_loss (bench/time_to_loss.py, minutes even at --smoke sizes; its own test below)


def smoke(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_smoke_run_passes_every_stage_and_prints_the_report_last(tmp_path):
    result = smoke(tmp_path, "--stages", *STAGES)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [name for name in report if name in STAGES] == STAGES
    assert {name: report[name]["ok"] for name in STAGES} == dict.fromkeys(STAGES, True)
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert result.stdout.endswith(markdown) and "## Missing" not in markdown

    environment = report["environment"]["result"]
    assert {"numpy", "pyarrow", "fsspec", "huggingface-hub", "triton"} <= environment["versions"].keys()
    assert all(row["math"] == "ok" for row in environment["sdpa"].values())  # the math backend runs everything
    assert "skipped" in report["cuda_tests"]["result"]["summary"]  # collected, and skipped without a GPU
    assert all(report["train"]["result"]["checks"].values())
    rows = report["throughput"]["result"]
    assert {(r["attention"], r["variant"]) for r in rows} == {
        ("MHA", "gptlab-compiled"),
        ("MHA", "gptlab-eager"),
        ("MHA", "reference-eager"),
        ("GQA-4", "gptlab-eager"),
        ("MQA", "gptlab-eager"),
        ("Llama GQA-4", "gptlab-eager"),
    }
    assert all(r["tokens_per_s"] > 0 and 0 < r["of_matmul"] for r in rows)
    assert set().union(*rows) == {  # nothing else in a row
        "attention",
        "variant",
        "batch",
        "context",
        "tokens_per_s",
        "mfu",
        "of_matmul",
        "matmul_flops",
        "peak_memory_gib",
        "over_reference",
        "recompiles_after_warmup",
        "graph_breaks",
    }
    decode = report["decode"]["result"]
    assert {r["attention"] for r in decode} == {"MHA", "GQA-4", "MQA"}
    assert all(r["graph_mode"] == "static" and r["graph_tokens_per_s"] > 0 for r in decode)  # no CUDA: no graph
    memory = report["memory"]["result"]  # the step's peak at 1 and 2 sequences, counted on the CPU
    assert [r["micro_batch"] for r in memory["rows"]] == [1, 2] and memory["rows"][0]["peak_bytes"] > 0
    assert [f["card_gib"] for f in memory["fits"]] == [24, 40, 80]
    for heading in (
        "| static ms/token |",
        "## Training throughput",
        "## KV-cached decode",
        "## Targets",
        "## Training memory: the step's peak, and what fits",
        "| eager | 24 GiB |",
    ):
        assert heading in markdown


def test_a_failed_variant_or_decode_mode_keeps_the_other_rows_on_disk(tmp_path, monkeypatch):
    """Failures injected as an Inductor error would come (the compiled variant's first
    step), in the timed steps of one variant, and in every CUDA-graph (here static) decode."""
    from bench import gpu_check, gpu_figures

    real_steps, real_generation = gpu_figures.timed_steps, gpu_figures.timed_generation
    seen_on_disk = []

    def failing_steps(trainers, batches, warmup, steps):
        if "gptlab-compiled" in trainers or ("reference-eager" in trainers and steps > 0):
            raise RuntimeError("injected: the variant broke")
        return real_steps(trainers, batches, warmup, steps)

    def failing_generation(model, prompts, steps, warmup, decode):
        if decode == "static":
            seen_on_disk.append(((tmp_path / "gpu_check.md").read_text(), (tmp_path / "gpu_check.json").read_text()))
            raise RuntimeError("injected: graph capture failed")
        return real_generation(model, prompts, steps, warmup, decode)

    monkeypatch.setattr(gpu_figures, "timed_steps", failing_steps)
    monkeypatch.setattr(gpu_figures, "timed_generation", failing_generation)
    with pytest.raises(SystemExit) as exit:
        gpu_check.main(["--smoke", "--out", str(tmp_path), "--stages", "throughput", "decode"])
    assert exit.value.code == 1

    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {(r["attention"], r["variant"]): r for r in report["throughput"]["result"]}
    assert (
        "injected" in rows["MHA", "gptlab-compiled"]["error"] and "injected" in rows["MHA", "reference-eager"]["error"]
    )
    for kept in [
        ("MHA", "gptlab-eager"),
        ("GQA-4", "gptlab-eager"),
        ("MQA", "gptlab-eager"),
        ("Llama GQA-4", "gptlab-eager"),
    ]:
        assert rows[kept]["tokens_per_s"] > 0 and "error" not in rows[kept]
    decode = report["decode"]["result"]
    assert len(decode) == 12 and all(r["tokens_per_s"] > 0 and "injected" in r["graph_error"] for r in decode)

    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| throughput | 2 of 6 rows FAILED |" in markdown and "| decode | 12 of 12 rows FAILED |" in markdown
    assert "| MHA | gptlab-compiled | FAILED: RuntimeError: injected: the variant broke |" in markdown
    assert "| FAILED: RuntimeError: injected: graph capture failed | - |" in markdown
    assert "--stages throughput decode" in markdown  # the call that reruns them
    # Both files are rewritten after every row: the first failing decode found the throughput
    # rows and the decode stage running on disk, the second one the first decode row too.
    (first_md, first_json), (second_md, second_json) = seen_on_disk[:2]
    assert "| MHA | gptlab-eager | 4 x 64 |" in first_md and "| decode | running" in first_md
    assert len(json.loads(first_json)["throughput"]["result"]) == 6
    assert "| MHA | 1 | 8 |" in second_md and len(json.loads(second_json)["decode"]["result"]) == 1


def test_the_time_to_loss_stage_runs_the_benchmark_at_its_sizes_and_reports_its_table(tmp_path, monkeypatch):
    from bench import gpu_check
    from bench.time_to_loss import Run, summarise

    commands = []

    def fake_run(command, timeout):
        commands.append(command)
        runs = [
            Run(arm, 1, 30, 3.0, 960, final, [(0.0, 0, 5.0), (3.0, 960, final)])
            for arm, final in (("gpt2", 4.5), ("modern", 4.0))
        ]
        Path(command[command.index("--json") + 1]).write_text(
            json.dumps({"budget_s": 3.0, "arms": {}, "rows": summarise(runs)})
        )
        return ""

    monkeypatch.setattr(gpu_check, "_run", fake_run)
    with pytest.raises(SystemExit) as exit:
        gpu_check.main(
            ["--smoke", "--out", str(tmp_path), "--work", str(tmp_path / "work"), "--stages", "time_to_loss"]
        )
    assert exit.value.code == 0
    [command] = commands
    assert command[1] == "bench/time_to_loss.py" and command[command.index("--budget-s") + 1] == "3"
    sizes = gpu_check.Sizes(smoke=True)
    assert command[command.index("--overrides") + 1 :] == [
        *sizes.time_to_loss_overrides,
        f"data.data_dir={tmp_path / 'work' / 'data'}",
    ]
    assert "model=gpt2" in gpu_check.Sizes(smoke=False).time_to_loss_overrides  # GPT-2 small's shape on the GPU
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "## The GPT-2 recipe against the modern one, 3 s of training each" in markdown
    assert "| modern | 30 | 0 + 3 | 4.0000 |  | 1/1 |" in markdown


def test_a_report_that_cannot_be_rendered_still_leaves_its_json(tmp_path):
    from bench.gpu_report import Recorder

    report = {"date": "2026-12-01 10:00:00", "smoke": True}  # no "asked": render() fails on it
    markdown = Recorder(tmp_path, report, deadline=0).save()
    assert markdown.startswith("# GPU acceptance run\n\nnot rendered (KeyError: 'asked'): read gpu_check.json")
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.md"]


def test_variants_the_budget_cannot_hold_are_recorded_as_skipped():
    from bench.gpu_check import Sizes
    from bench.gpu_figures import decode, throughput

    class NoTimeLeft:
        def __init__(self):
            self.rows = []

        def add(self, row):
            self.rows.append(row)

        def left(self):
            return 1.0

    for stage, variants in ((throughput, ["MHA", "GQA-4", "MQA", "Llama GQA-4"]), (decode, ["MHA", "GQA-4", "MQA"])):
        sink = NoTimeLeft()
        stage(torch.device("cpu"), Sizes(smoke=True), sink)
        assert [(r["attention"], r["skipped"][:6]) for r in sink.rows] == [(v, "needs ") for v in variants]


def test_a_budget_too_short_for_the_last_stages_skips_them_cleanly(tmp_path):
    # The smoke estimates: environment 2 s, train 120 s, cuda_tests 40 s: 38 s holds the first only
    # (with up to 36 s to start Python and import torch on a loaded machine).
    result = smoke(tmp_path, "--budget-s", "38", "--stages", "environment", "train", "cuda_tests")
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["environment"]["ok"] is True
    for name in ("train", "cuda_tests"):
        assert report[name]["ok"] is None and report[name]["skipped"].startswith("needs ~")
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| train | skipped: needs ~120 s," in markdown
    assert f"python bench/gpu_check.py --smoke --out {tmp_path} --budget-s 38 --stages train cuda_tests" in markdown


def test_a_failed_stage_is_reported_and_the_others_still_show():
    report = {
        "date": "2026-12-01 10:00:00",
        "smoke": False,
        "budget_s": 540,
        "out": "gpu/",
        "asked": STAGES,
        "environment": {
            "ok": True,
            "seconds": 1.0,
            "result": {
                "gpu": "NVIDIA H200",
                "torch": "2.11.0",
                "compute_mode": "Default",
                "versions": {"numpy": "2.5.2"},
            },
        },
        "train": {"ok": False, "seconds": 2.0, "error": "RuntimeError: train.py failed\nmore"},
        "decode": {
            "ok": True,
            "seconds": 3.0,
            "result": [
                {
                    "attention": a,
                    "batch": batch,
                    "context": 1000,
                    "ms_per_token": ms,
                    "tokens_per_s": batch * 1e3 / ms,
                    "graph_mode": "graph",
                    "graph_ms_per_token": ms / speedup,
                    "graph_tokens_per_s": batch * 1e3 * speedup / ms,
                    "graph_over_eager": speedup,
                    "kv_cache_bytes_full_context": mib * 2**20,
                }
                for a, ms, mib, speedup in (("MHA", 20.0, 2304, 3.5), ("MQA", 10.0, 192, 2.0))
                for batch in (1, 64)
            ],
        },
        "cuda_tests": {"ok": None, "skipped": "needs ~120 s, 30 s left"},
    }
    markdown = render(report)
    assert "# GPU acceptance run: NVIDIA H200" in markdown and "compute mode Default" in markdown
    assert "numpy 2.5.2" in markdown
    assert "| train | FAILED: RuntimeError: train.py failed |" in markdown
    assert "| throughput | not run yet | - |" in markdown
    assert "| cuda_tests | skipped: needs ~120 s, 30 s left | - |" in markdown
    assert "batch-64 MQA decode at context 1000 faster than MHA (cache 12x smaller): 2.00x (met)" in markdown
    assert "batch-1 graph decode at context 1000 >= 3x eager (MHA): 3.50x (met)" in markdown
    assert "batch-1 graph decode at context 1000 >= 3x eager (MQA): 2.00x (NOT met)" in markdown
    assert markdown.endswith(
        "python bench/gpu_check.py --out gpu/ --budget-s 540 --stages throughput memory train cuda_tests\n"
    )


def fake_wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return wheel


def test_gpu_wheels_checks_each_requirement_against_the_wheels_and_the_machine(tmp_path):
    from bench.gpu_wheels import check_requirements

    wheels = [
        fake_wheel(
            tmp_path,
            "datasets",
            "9.0",
            [
                "numpy>=1.17",
                "huggingface-hub<1.0,>=0.23",
                "dill<0.4",
                "pyarrow>=24",
                "filelock",
                "xxhash-ng",
                "colorama; sys_platform == 'win32'",
                "pytest; extra == 'tests'",
                "typing; python_version < '3.5'",
            ],
        ),
        fake_wheel(tmp_path, "dill", "0.4.1", []),
    ]
    base = {"numpy": "2.5.2", "huggingface_hub": "1.33.0", "pyarrow": None, "filelock": None}
    problems, notes = check_requirements(wheels, base)
    assert problems == [
        "datasets needs huggingface-hub<1.0,>=0.23, but the GPU machine has huggingface-hub 1.33.0",
        "datasets needs dill<0.4, but .whl/ has dill 0.4.1",
        "datasets needs xxhash-ng, which neither .whl/ nor the GPU machine has",
    ]
    assert notes == ["datasets needs pyarrow>=24: the GPU machine has pyarrow, its version unchecked"]


def test_gptlab_admits_the_gpu_machines_expected_versions_and_the_torch_here():
    """pyproject.toml's ranges hold the GPU machine's expected torch 2.11, numpy, ... and this
    environment's torch; every test dependency is expected there or carried in .whl/."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.version import Version

    from bench.gpu_wheels import BASE, PACKAGES

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    documented = {r.name: BASE[r.name] for r in requirements if BASE.get(r.name)}
    assert {"torch", "numpy", "safetensors", "tiktoken", "transformers"} <= documented.keys()
    assert [r for r in requirements if r.name in documented and not r.specifier.contains(documented[r.name])] == []
    torch_range = next(r.specifier for r in requirements if r.name == "torch")
    assert Version(torch.__version__).base_version in torch_range
    dev = {canonicalize_name(Requirement(line).name) for line in project["optional-dependencies"]["dev"]}
    # but ruff: it lints the source in CI (.ci/run), which the GPU check never does
    assert dev - {canonicalize_name(name) for name in [*BASE, *PACKAGES]} == {"ruff"}


def imported_top_level_names(files: list[Path]) -> set[str]:
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_package_tests_and_bench_import_is_declared_in_pyproject():
    """A new venv with `pip install -e ".[dev,eval]"` has everything tests/ and bench/ import."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(line for extra in project["optional-dependencies"].values() for line in extra)]
    declared = {canonicalize_name(Requirement(line).name) for line in lines}
    files = [*(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    ours = {path.stem for path in [*REPO.glob("*.py"), *files]} | {
        path.parent.name for path in REPO.glob("*/__init__.py")
    }
    third_party = imported_top_level_names(files) - set(sys.stdlib_module_names) - ours - {"tests", "bench"}
    distributions = packages_distributions()
    undeclared = {
        name: distributions.get(name)
        for name in third_party
        if not {canonicalize_name(d) for d in distributions.get(name, [])} & declared
    }
    assert undeclared == {}


def test_the_gpu_check_installs_the_wheels_when_any_declared_package_they_carry_is_missing():
    """bench/gpu_check.py installs .whl/ only when an import of NEEDED fails: each declared
    package that gpu_wheels carries (hypothesis, pytest-xdist, hydra-core, ...) is one of them."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    from bench.gpu_check import NEEDED
    from bench.gpu_wheels import PACKAGES

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {
        canonicalize_name(Requirement(line).name)
        for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    }
    carried = declared & {canonicalize_name(name) for name in PACKAGES}
    distributions = packages_distributions()
    checked = {canonicalize_name(d) for name in NEEDED for d in distributions.get(name, [])}
    assert "hypothesis" in carried and carried - checked == set()
