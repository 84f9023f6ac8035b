"""bench/memory_fit.py: the arithmetic of what fits a GPU, checked against counts made by hand
and against the CPU's own allocations under bf16 autocast; its measurement (the memory stage
of bench/gpu_check.py) on the CPU; docs/training.md's table is the one it prints."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from bench.memory_fit import (
    CountedMemory,
    arithmetic_table,
    bytes_per_token,
    measure,
    preset_config,
    static_bytes,
)
from model import GPT

REPO = Path(__file__).resolve().parents[1]


def test_the_arithmetic_counts_gpt2s_parameters_and_bytes_per_token_by_hand():
    d, layers, vocab, context = 768, 12, 50304, 1024
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)  # norms, attn, mlp
    params = vocab * d + context * d + layers * block + 2 * d  # tied head
    assert static_bytes(preset_config()) == 18 * params  # weights 4, grads 4, AdamW 8, bf16 copies 2
    assert static_bytes(preset_config(), world_size=8) == 22 * params  # DDP's buckets
    assert bytes_per_token(preset_config(), compiled=False) == layers * 38 * d + 12 * vocab


def test_a_layers_activations_per_token_under_bf16_autocast_are_what_the_arithmetic_says():
    """The CPU's bf16 autocast keeps 34-38 bytes per token and unit of width for a layer (the
    arithmetic's 38d is the larger): two depths and two batches cancel the weights' copies."""
    context, width = 32, 64
    saved = {}
    for layers in (1, 2):
        model = GPT(
            replace(preset_config("gpt2", vocab_size=64), n_layer=layers, n_head=4, n_embd=width, block_size=context)
        )
        for batch in (4, 8):
            x = torch.randint(64, (batch, context))
            meter = CountedMemory()
            with meter.watch(), torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, x)[1]
                saved[layers, batch] = meter.live
            del loss
    per_token_layer = ((saved[2, 8] - saved[1, 8]) - (saved[2, 4] - saved[1, 4])) / (4 * context)
    assert 34 * width <= per_token_layer <= 38 * width


def test_the_memory_stage_measures_the_step_and_fits_a_line_through_it():
    config = replace(preset_config("nano", vocab_size=512), block_size=32)
    result = measure(torch.device("cpu"), config, (1, 2), "fp32", (False,))
    peaks = [row["peak_bytes"] for row in result["rows"]]
    assert len(peaks) == 2 and 0 < peaks[0] < peaks[1]
    assert [f["card_gib"] for f in result["fits"]] == [24, 40, 80] and all(f["measured"] == 512 for f in result["fits"])
    assert len(result["arithmetic"]) == 6


def test_the_docs_table_is_the_one_the_arithmetic_prints():
    printed = subprocess.run(
        [sys.executable, "bench/memory_fit.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    table = [line for line in printed.splitlines() if line.startswith("| ") and "GB |" in line]
    docs = (REPO / "docs" / "training.md").read_text()
    assert len(table) == 3 and all(line in docs for line in table)
    assert {(r["card_gib"], r["compile"]): r["micro_batch"] for r in arithmetic_table(preset_config())} == {
        (24, False): 16,
        (40, False): 32,
        (80, False): 64,
        (24, True): 32,
        (40, True): 32,
        (80, True): 128,
    }
