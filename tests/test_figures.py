"""bench/figures.py: the docs' pictures from the committed results, no training."""

import json

import pytest
import torch

from ablation.decode import GPT2_SMALL
from bench import figures
from model import GPTConfig, KVCache


def test_every_figure_is_drawn_from_the_committed_results(tmp_path):
    figures.main(["--out", str(tmp_path / "images")])
    for name in figures.FIGURES:
        assert (tmp_path / "images" / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name


@pytest.mark.parametrize("n_kv_head", [12, 4, 1])
def test_kv_cache_sizes_are_the_caches_own(n_kv_head):
    cache = KVCache(GPTConfig(**GPT2_SMALL, n_kv_head=n_kv_head), batch_size=1, max_len=1024, dtype=torch.bfloat16)
    assert figures.kv_cache_mib(n_kv_head) == cache.nbytes / 2**20
    assert figures.kv_head_of_query(12, n_kv_head) == [h // (12 // n_kv_head) for h in range(12)]


def test_loss_curves_are_in_bits_per_byte_of_their_own_split():
    records = [json.loads(line) for line in (figures.RESULTS / "default_run" / "modern_metrics.jsonl").open()]
    curves = figures.loss_curves(records)
    last_eval, last_step = records[-1], records[-2]
    assert (last_eval["kind"], last_step["kind"], last_step["step"]) == ("eval", "train", 500)
    assert curves["val"] == ([0, 200, 400, 500], [r["val_bpb"] for r in records if r["kind"] == "eval"])
    # a logged step's nats per token, at the train split's bytes per token
    assert curves["train"][1][-1] == pytest.approx(last_step["loss"] * last_eval["train_bpb"] / last_eval["train_loss"])
    assert round(curves["val"][1][-1], 2) == 1.82  # docs/training.md's table


def test_decode_and_throughput_tables_read_the_right_rows():
    by_format = figures.decode_by_format(figures.load("decode_weights_cpu.json"))
    assert round(by_format[32]["int8"], 1) == 163.1 and round(by_format[960]["fp32"], 1) == 39.3  # docs/weights.md
    mha_batch_1 = figures.decode_by_format(figures.load("decode_fp32_cpu.json"))
    assert round(mha_batch_1[960]["fp32"], 1) == 37.4  # not GQA's or MQA's, not batch 8's
    by_layout = figures.decode_by_layout(figures.load("decode_fp32_cpu.json"))
    assert round(by_layout[(8, 960)]["MQA"], 1) == 136.5 and round(by_layout[(1, 32)]["GQA"], 1) == 49.6
    cells = figures.throughput_over_reference(figures.load("train_throughput_cpu.json"))
    assert round(cells["gpt2 fp32"]["gptlab-compiled"][1]) == 181 and cells["mini fp32"]["reference-eager"][0] == 1.0
