"""bench/prepare_throughput.py: its corpora, its process-tree and disk measures (bench/process_tree.py),
and an end-to-end run at a tiny size (speed itself is never asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.prepare_throughput import extra_cache_dirs, markdown_table, raw_tiktoken_rate
from bench.process_tree import disk_bytes, measure_command, tree_pids
from bench.synthetic_corpus import GB, load_pool, prepare_corpora

ROOT = Path(__file__).resolve().parents[1]
TINY_GB = 0.002


def test_corpora_have_the_asked_size_and_are_reused_until_the_size_changes(tmp_path):
    pool = load_pool()
    assert len(pool) > 500 and len({doc.name for doc in pool}) == len(pool)  # stdlib files + pydoc topics
    corpus = tmp_path / "corpus"
    entries = prepare_corpora(corpus, TINY_GB, ["text-dir", "jsonl"], pool)
    assert entries["text-dir"]["files"] == len(list((corpus / "text-dir").glob("*.txt"))) > 50
    jsonl = corpus / "jsonl" / "corpus.jsonl"
    rows = [json.loads(line)["text"] for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == entries["jsonl"]["documents"] and rows[0].startswith("# copy 0 of ")
    assert len(set(rows)) == len(rows)  # every copy is varied
    for entry in entries.values():
        assert TINY_GB * GB <= entry["text_bytes"] < 1.2 * TINY_GB * GB
        assert 0.9 * TINY_GB * GB < entry["file_bytes"] < 1.3 * TINY_GB * GB
    stamp = jsonl.stat().st_mtime_ns
    assert prepare_corpora(corpus, TINY_GB, ["jsonl"], pool) == {"jsonl": entries["jsonl"]}
    assert jsonl.stat().st_mtime_ns == stamp  # same parameters: reused, not rewritten
    smaller = prepare_corpora(corpus, TINY_GB / 2, ["jsonl"], pool)
    assert smaller["jsonl"]["text_bytes"] < entries["jsonl"]["text_bytes"]
    assert not (corpus / "text-dir").exists()  # other parameters: the old corpora are gone


def test_raw_reference_counts_the_tokens_of_the_stream():
    result = raw_tiktoken_rate(load_pool(), 100_000, threads=1, repeats=1)
    assert result["text_bytes"] >= 100_000 and result["tokens"] > result["text_bytes"] / 10
    assert result["tokens_per_s"] > 0


def test_tree_sampler_finds_a_grandchilds_memory_and_disk_at_their_peak(tmp_path):
    written = tmp_path / "data" / "sub" / "blob"
    child = (
        f"import os, time; x = bytearray(200_000_000); p = {str(written)!r}; "
        "os.makedirs(os.path.dirname(p)); open(p, 'wb').write(os.urandom(5_000_000)); "
        "time.sleep(1); os.remove(p)"
    )
    # `; exit 0` keeps the shell from exec-ing python: python is its child, the grandchild measured
    command = ["sh", "-c", f'{sys.executable} -c "{child}"; exit 0']
    measurement = measure_command(command, [tmp_path / "data"], tmp_path / "logs", cwd=ROOT)
    assert measurement.returncode == 0, (tmp_path / "logs" / "stderr.log").read_text()
    peaks = measurement.peaks
    assert peaks.processes >= 2 and peaks.samples >= 3
    assert peaks.rss >= 190e6 and peaks.pss >= 190e6
    assert peaks.disk >= 5_000_000 and measurement.disk_left == 0


def test_disk_measure_counts_a_written_file_and_tree_pids_starts_at_the_root(tmp_path):
    before = disk_bytes([tmp_path])
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "file").write_bytes(os.urandom(1_000_000))
    assert 1_000_000 <= disk_bytes([tmp_path]) - before < 1_100_000
    assert disk_bytes([tmp_path / "missing"]) == 0
    assert tree_pids(os.getpid())[0] == os.getpid()


def test_benchmark_reports_a_row_per_kind(tmp_path):
    out = tmp_path / "report.json"
    args = [
        "--gb",
        str(TINY_GB),
        "--kinds",
        "text-dir",
        "jsonl",
        "--threads",
        "1",
        "--scratch",
        str(tmp_path / "scratch"),
        "--json",
        str(out),
    ]
    run = subprocess.run(
        [sys.executable, "bench/prepare_throughput.py", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert [row["kind"] for row in report["rows"]] == ["text-dir", "jsonl"]
    for row in report["rows"]:
        assert row["returncode"] == 0 and row["tokens"] > 0 and row["peak_rss_bytes"] > 0
        assert row["shard_bytes"] > 0 and row["peak_disk_bytes"] >= row["shard_bytes"]
    assert report["reference"]["tokens"] > 0 and report["reference"]["threads"] == 1
    assert (tmp_path / "scratch" / "corpus" / "manifest.json").exists()
    assert not (tmp_path / "scratch" / "runs" / "jsonl" / "data").exists()  # removed without --keep
    assert "| text-dir | 0.002 |" in run.stdout and "| jsonl | 0.002 |" in run.stdout


def test_table_marks_a_failed_kind_and_a_moved_cache_counts():
    row = {
        "kind": "jsonl",
        "text_bytes": GB,
        "file_bytes": GB,
        "returncode": 1,
        "seconds": 2.0,
        "peak_rss_bytes": GB,
        "peak_pss_bytes": GB // 2,
    }
    table = markdown_table(None, [row]).splitlines()
    assert len(table) == 3 and table[2].startswith("| jsonl | 1.000 | 1.000 | failed (exit 1) | 2.00 |")
    assert extra_cache_dirs(["data.batch_mb=8", "data.hf_cache_dir='/tmp/hf'"]) == [Path("/tmp/hf").resolve()]
