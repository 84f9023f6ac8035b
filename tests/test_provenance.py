"""Results and reports record where they were measured: commit (and a dirty tree), date, machine, torch."""

import argparse
import datetime
import json
import re
import subprocess

import torch

import report
from bench.train_throughput import write_json
from training import provenance
from training.provenance import ROOT

NO_GIT = "unknown (not a git checkout)"


def head_commit() -> str:
    """The checkout's commit; what provenance records without git (a release archive, a zip)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return NO_GIT


def test_a_checkout_without_git_records_that_it_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)  # no .git here or above (tmp_path is outside the checkout)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.git_state() == NO_GIT


def test_results_json_records_commit_date_machine_and_torch(tmp_path):
    path = tmp_path / "throughput.json"
    write_json(path, argparse.Namespace(warmup=1, steps=3), torch.device("cpu"), {}, [], (0.0, 0.0))
    recorded = json.loads(path.read_text())["provenance"]
    assert recorded["gptlab"].startswith(head_commit())
    assert recorded["torch"] == torch.__version__
    assert recorded["machine"].endswith(f"{torch.get_num_threads()} threads")
    age = datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(recorded["date"])
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=5)


def test_report_header_names_commit_date_machine_and_torch(tmp_path):
    text = report.header(tmp_path, [], torch.device("cpu"), [])
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert f"gptlab {head_commit()}" in text and f"torch {torch.__version__}" in text and f"({today}T" in text


def recorded_commits(value) -> list[str]:
    """Every 'gptlab' or 'commit' text anywhere in a results file."""
    if isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in ([item] if key in ("gptlab", "commit") and isinstance(item, str) else recorded_commits(item))
        ]
    return [found for item in value for found in recorded_commits(item)] if isinstance(value, list) else []


def test_every_results_file_names_the_commit_it_was_measured_at():
    results = sorted((ROOT / "bench" / "results").rglob("*.json"))
    assert results
    unnamed = [
        path.name
        for path in results
        if not any(re.match(r"[0-9a-f]{7,40}\b", commit) for commit in recorded_commits(json.loads(path.read_text())))
    ]
    assert unnamed == []
