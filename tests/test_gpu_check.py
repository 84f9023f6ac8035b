"""The GPU acceptance run cannot rot between GPU runs: its --smoke mode runs every stage
on the CPU at tiny sizes, through the same code."""

import json
import subprocess
import sys
from pathlib import Path

from bench.gpu_report import render

REPO = Path(__file__).resolve().parents[1]
STAGES = ("environment", "cuda_tests", "train", "throughput", "decode")


def test_the_smoke_run_passes_every_stage_and_prints_the_report_last(tmp_path):
    result = subprocess.run([sys.executable, "bench/gpu_check.py", "--smoke", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {name: report[name]["ok"] for name in STAGES} == dict.fromkeys(STAGES, True)
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert result.stdout.endswith(markdown)

    sdpa = report["environment"]["result"]["sdpa"]
    assert {"train causal (MHA)", "padded prefill (boolean mask)"} <= sdpa.keys()
    assert all(row["math"] == "ok" for row in sdpa.values())  # the math backend runs everything
    assert "skipped" in report["cuda_tests"]["result"]["summary"]  # collected, and skipped without a GPU
    assert all(report["train"]["result"]["checks"].values())
    rows = report["throughput"]["result"]
    assert {(r["attention"], r["variant"]) for r in rows} >= {
        ("MHA", "gptlab-compiled"), ("MHA", "reference-compiled"), ("GQA-4", "gptlab-eager"), ("MQA", "gptlab-eager")}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    decode = report["decode"]["result"]
    assert {r["attention"] for r in decode} == {"MHA", "GQA-4", "MQA"}
    assert all(r["graph_mode"] == "static" and r["graph_tokens_per_s"] > 0 for r in decode)  # no CUDA: no graph
    assert "| static ms/token |" in markdown
    for heading in ("## Training throughput", "## KV-cached decode", "## Targets"):
        assert heading in markdown


def test_a_failed_stage_is_reported_and_the_others_still_show():
    report = {
        "date": "2026-12-01 10:00:00", "smoke": False,
        "environment": {"ok": True, "seconds": 1.0, "result": {"gpu": "NVIDIA H200", "torch": "2.11.0"}},
        "train": {"ok": False, "seconds": 2.0, "error": "RuntimeError: train.py failed\nmore"},
        "decode": {"ok": True, "seconds": 3.0, "result": [
            {"attention": a, "batch": batch, "context": 1000, "ms_per_token": ms, "tokens_per_s": batch * 1e3 / ms,
             "graph_mode": "graph", "graph_ms_per_token": ms / speedup, "graph_tokens_per_s": batch * 1e3 * speedup / ms,
             "graph_over_eager": speedup, "kv_cache_bytes_full_context": mib * 2**20}
            for a, ms, mib, speedup in (("MHA", 20.0, 2304, 3.5), ("MQA", 10.0, 192, 2.0)) for batch in (1, 64)]},
    }
    markdown = render(report)
    assert "# GPU acceptance run: NVIDIA H200" in markdown
    assert "| train | FAILED: RuntimeError: train.py failed |" in markdown
    assert "batch-64 MQA decode at context 1000 faster than MHA (cache 12x smaller): 2.00x (met)" in markdown
    assert "batch-1 graph decode at context 1000 >= 3x eager (MHA): 3.50x (met)" in markdown
    assert "batch-1 graph decode at context 1000 >= 3x eager (MQA): 2.00x (NOT met)" in markdown
