"""bench/decode.py and bench/weight_quality.py run end to end and reports every figure it promises (a smoke test:
speed itself is never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import train
from attention_variants import BLOCKS
from conf import CONF_DIR
from conftest import tiny_config, training_overrides
from model import GPT, KVCache

ROOT = Path(__file__).resolve().parents[1]


def test_decode_benchmark_reports_rows_ratios_and_matrix_rates(tmp_path):
    out = tmp_path / "decode.json"
    args = [
        "--variants",
        "MQA",
        "MHA",
        "--weights",
        "fp32",
        "int8",
        "--batch",
        "1",
        "--short",
        "4",
        "--long",
        "8",
        "--tokens",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--recompute-steps",
        "1",
        "--repeats",
        "1",
        "--threads",
        "1",
        "--json",
        str(out),
    ]
    run = subprocess.run([sys.executable, "bench/decode.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["bandwidth_gb_s"] > 0 and result["plain_read_gb_s"] > 0 and result["huge_pages"] is True
    assert {"date", "machine", "torch", "gptlab"} <= set(result["provenance"])
    assert [(r["variant"], r["context"], r["weights"]) for r in result["rows"]] == [
        (variant, context, weights) for variant in ("MQA", "MHA") for context in (4, 8) for weights in ("fp32", "int8")
    ]
    for row in result["rows"]:
        assert row["ms_per_token"] > 0 and row["prefill_ms"] > 0
        assert 0 < row["read_ceiling_tokens_per_s"] and 0 < row["ceiling_tokens_per_s"]
        assert abs(row["tokens_per_s"] * row["ms_per_token"] - 1e3) < 1e-6 * 1e3  # batch 1
    kv = {r["variant"]: r["kv_cache_mib"] for r in result["rows"]}
    assert kv == {"MHA": 72.0, "MQA": 6.0}  # gpt2 preset, 1024 positions, fp32
    assert set(result["recompute_over_cached"]) == {"MQA", "MHA"}
    assert result["mqa_over_mha_tokens_per_s"] > 0
    ceiling = {(r["variant"], r["weights"], r["context"]): r["ceiling_tokens_per_s"] for r in result["rows"]}
    assert 3.5 < ceiling[("MHA", "int8", 4)] / ceiling[("MHA", "fp32", 4)] < 4  # a quarter of the weight bytes
    assert set(result["over_first_weights_tokens_per_s"]) == {
        f"{variant} int8 context {context}" for variant in ("MQA", "MHA") for context in (4, 8)
    }
    assert "batch 1, MHA int8 context 8:" in run.stdout
    assert set(result["matrix_gb_s"]) == {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "lm_head"}
    assert "MQA batch 1: each weight's matrix-vector product timed alone" in run.stdout


def test_weight_quality_benchmark_compares_every_format_with_fp32(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        train.train(compose(config_name="train", overrides=training_overrides(tmp_path)))
    out = tmp_path / "quality.json"
    args = [
        "--runs-root",
        str(tmp_path / "runs"),
        "--eval-iters",
        "2",
        "--batch-size",
        "2",
        "--prompts",
        "2",
        "--prompt-tokens",
        "4",
        "--tokens",
        "40",
        "--json",
        str(out),
    ]
    run = subprocess.run([sys.executable, "bench/weight_quality.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert {"date", "machine", "torch", "gptlab"} <= set(result["provenance"])
    rows = {r["weights"]: r for r in result["rows"]}
    assert list(rows) == ["fp32", "bf16", "int8"]
    assert rows["fp32"]["val_loss_change"] == 0 and rows["fp32"]["teacher_forced_agreement"] == 1
    assert rows["fp32"]["first_difference"] == ["none", "none"]
    for row in rows.values():
        assert row["val_loss"] > 0 and 0 <= row["free_running_agreement"] <= 1
    assert rows["int8"]["val_loss_change"] != 0  # the format really changed the weights


def test_weight_quality_without_the_runs_data_says_what_is_missing(tmp_path):
    run = subprocess.run(
        [sys.executable, "bench/weight_quality.py", "--runs-root", str(tmp_path / "none")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and run.stderr.startswith("error: ") and "Traceback" not in run.stderr


@pytest.mark.parametrize("block", BLOCKS)
def test_a_decode_step_reads_every_weight_once_and_one_row_of_the_position_table(block):
    sys.path.insert(0, str(ROOT / "bench"))
    from decode import bytes_per_step

    model = GPT(tiny_config(**block))
    cache = KVCache(model.config, 2, max_len=16, device="meta").nbytes
    weights = sum(p.nbytes for p in model.parameters())  # lm_head is wte: counted once
    if "wpe" in model.transformer:
        weights -= (model.config.block_size - 1) * model.config.n_embd * 4
    assert bytes_per_step(model, batch=2, context=16) == weights + cache
