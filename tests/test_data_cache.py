"""Prepared data is never silently rebuilt: other token settings than a data directory holds
are refused by name, and experiments that slice a corpus keep directories of their own."""

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from conf import CONF_DIR
from data.cache import token_settings
from prepare import config_from_overrides, main

EXPERIMENTS = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
DATA_PRESETS = sorted(path.stem for path in (CONF_DIR / "data").glob("*.yaml"))


def stamps(data_dir: Path) -> dict:
    """Each prepared file's inode and modification time: a rewrite changes one or the other."""
    return {
        name: ((data_dir / name).stat().st_ino, (data_dir / name).stat().st_mtime_ns)
        for name in ("train.bin", "val.bin", "meta.json")
    }


def prepare_command(capsys, *overrides: str) -> str:
    """`python prepare.py <overrides>` in this process: what it printed last, or its error line."""
    try:
        main([*overrides, "data.num_proc=1"])
    except SystemExit as stop:
        return str(stop.code)
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_files_preset_with_and_without_max_documents_never_rewrites(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "D").mkdir()
    for i in range(4):
        (tmp_path / "D" / f"doc{i}.txt").write_text(f"document {i}: " + "some words " * 20, encoding="utf-8")
    plain = ["data=files", "data.path=D"]
    assert prepare_command(capsys, *plain).startswith("wrote data_cache/files:")
    before = stamps(tmp_path / "data_cache" / "files")

    refusal = prepare_command(capsys, *plain, "data.max_documents=2")
    assert refusal == (
        "error: data_cache/files holds data prepared with other settings than this run's "
        "data.max_documents=2 (it holds null): give this data a directory of its own "
        "(data.name=files_max_documents2), or delete data_cache/files to prepare it again with "
        "these settings"
    )
    assert prepare_command(capsys, *plain).startswith("reused data_cache/files:")
    assert stamps(tmp_path / "data_cache" / "files") == before

    # The first way out: the directory the refusal names, which then lives beside the first.
    assert prepare_command(capsys, *plain, "data.max_documents=2", "data.name=files_max_documents2").startswith(
        "wrote data_cache/files_max_documents2:"
    )
    assert json.loads((tmp_path / "data_cache/files_max_documents2/meta.json").read_text())["documents"] == 2
    assert prepare_command(capsys, *plain).startswith("reused data_cache/files:")
    assert stamps(tmp_path / "data_cache" / "files") == before


@pytest.fixture()
def local_fineweb(tmp_path):
    """A small jsonl dataset directory standing in for FineWeb-Edu on the Hub (enough tokens
    that the preset's val_fraction, 0.0005, holds some out)."""
    root = tmp_path / "fineweb"
    root.mkdir()
    rows = [{"text": f"page {i}: " + "an educational sentence about the web. " * 12} for i in range(60)]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return ["data.dataset=fineweb", "data.subset=null"]


def test_the_gpu_ablation_and_gpt2_fineweb_keep_their_own_shards(tmp_path, monkeypatch, capsys, local_fineweb):
    monkeypatch.chdir(tmp_path)
    experiments = ["experiment=attention_ablation_gpt2", "experiment=gpt2_fineweb"]
    dirs = {}
    for experiment in experiments:  # each prepares its own
        printed = prepare_command(capsys, experiment, *local_fineweb)
        assert printed.startswith("wrote "), printed
        dirs[experiment] = tmp_path / printed.split()[1].rstrip(":")
    assert len(set(dirs.values())) == 2
    before = {experiment: stamps(data_dir) for experiment, data_dir in dirs.items()}
    for experiment in [*experiments, *experiments]:  # and reuses it, whichever ran last
        assert prepare_command(capsys, experiment, *local_fineweb).startswith(
            f"reused {dirs[experiment].relative_to(tmp_path)}:"
        )
    assert {experiment: stamps(data_dir) for experiment, data_dir in dirs.items()} == before
    recorded = json.loads((dirs["experiment=attention_ablation_gpt2"] / "meta.json").read_text())["settings"]
    assert recorded["max_documents"] == 2_000_000


def test_no_two_experiments_or_presets_share_a_directory_with_other_settings():
    """What every experiment and data preset would prepare: a directory holds one set of token settings."""
    holders = defaultdict(dict)
    for overrides in [[]] + [[f"experiment={e}"] for e in EXPERIMENTS] + [[f"data={d}"] for d in DATA_PRESETS]:
        cfg = config_from_overrides([*overrides, *(["data.path=x"] if overrides == ["data=files"] else [])])
        settings = json.dumps(token_settings(cfg), sort_keys=True)
        holders[os.fspath(cfg.resolved_data_dir())].setdefault(settings, []).append(" ".join(overrides) or "default")
    shared = {directory: list(by.values()) for directory, by in holders.items() if len(by) > 1}
    assert not shared, f"these prepare other tokens into one directory: {shared}"
