"""The parameter counts the docs give for the model presets are what the model's code computes,
for the default run (its recipe and its corpus's tokenizer) and for GPT-2's recipe and tokens."""

import dataclasses
import itertools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conf import CONF_DIR, load_config, model_preset
from model import GPT

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PRESETS = ("nano", "micro", "mini", "small", "gpt2")
MILLIONS = re.compile(r"(\d+(?:\.\d+)?)M\b")
# A preset named with a parenthesis about it: "`mini` (4 x 128, ... 1.3M ...)", "mini model (1.3M)".
MENTION = re.compile(
    r"(?:`("
    + "|".join(PRESETS)
    + r")`(?:\s+(?:model|preset))?|\b("
    + "|".join(PRESETS)
    + r")\s+(?:model|preset))\s+\(([^()]*)\)"
)


def default_run_params(preset: str) -> int:
    """The preset under the default run's settings: its recipe and block, its corpus's vocabulary."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        config = load_config(compose(config_name="train", overrides=[f"model={preset}"]))
    pad = config.pad_vocab_to
    vocab = -(-config.data.vocab_size // pad) * pad
    return GPT.shapes_only(dataclasses.replace(config.model, vocab_size=vocab)).num_params()


def gpt2_tokens_params(preset: str) -> int:
    """The preset under GPT-2's recipe with GPT-2's 50,257 ids padded to 50,304."""
    return GPT.shapes_only(model_preset(preset, "model.vocab_size=50304")).num_params()


COUNTS = {p: (default_run_params(p), gpt2_tokens_params(p)) for p in PRESETS}


def rounds_to(figure: str, count: int) -> bool:
    """'1.3' (millions) is count rounded to the figure's own decimals."""
    decimals = len(figure.partition(".")[2])
    return round(count / 1e6, decimals) == float(figure)


def test_the_model_guides_preset_table_gives_both_counts_of_every_preset():
    lines = (REPO / "docs" / "model.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| preset "))
    block = itertools.takewhile(lambda line: line.startswith("|"), lines[start:])
    table = [[c.strip() for c in line.strip("|").split("|")] for line in block]
    columns, rows = table[0], {cells[0].strip("`"): cells for cells in table[2:]}
    default = columns.index("params, default recipe and corpus (4,096-id BPE)")
    gpt2 = columns.index("params, GPT-2's recipe and tokens (vocab 50,304)")
    assert set(rows) == set(PRESETS)
    for preset, cells in rows.items():
        assert rounds_to(cells[default].rstrip("M"), COUNTS[preset][0]), (preset, cells[default], COUNTS[preset][0])
        assert rounds_to(cells[gpt2].rstrip("M"), COUNTS[preset][1]), (preset, cells[gpt2], COUNTS[preset][1])


MENTIONS = [
    (page.name, quoted or bare, " ".join(said.split()))
    for page in PAGES
    for quoted, bare, said in MENTION.findall(page.read_text())
    if MILLIONS.search(said)
]


def test_the_docs_mention_preset_sizes():
    assert {(page, preset) for page, preset, _ in MENTIONS} >= {("README.md", "mini"), ("training.md", "mini")}


@pytest.mark.parametrize("page, preset, said", MENTIONS)
def test_every_size_the_docs_give_a_preset_is_one_the_code_computes(page, preset, said):
    shape = preset_shape(preset)
    for layers, width in re.findall(r"(\d+)(?: layers)? x (\d+)", said):
        assert (int(layers), int(width)) == shape, f"{page}: `{preset}` ({said})"
    for figure in MILLIONS.findall(said):
        assert any(rounds_to(figure, count) for count in COUNTS[preset]), (
            f"{page}: `{preset}` ({said}): {figure}M is none of {COUNTS[preset]}"
        )


def preset_shape(preset: str) -> tuple[int, int]:
    config = model_preset(preset)
    return config.n_layer, config.n_embd


def test_the_recipes_page_gives_the_default_models_size():
    text = (REPO / "docs" / "recipes.md").read_text()
    [figure] = re.findall(r"parameters to a (\d+(?:\.\d+)?)M model", text)
    assert rounds_to(figure, COUNTS["mini"][0])


def test_the_ladders_non_embedding_counts_are_the_codes():
    text = " ".join((REPO / "docs" / "ablation.md").read_text().split())
    figures = re.search(r"about ([\d.]+)M, ([\d.]+)M and ([\d.]+)M non-embedding", text).groups()
    for preset, figure in zip(("nano", "micro", "mini"), figures):
        assert rounds_to(figure, GPT.shapes_only(model_preset(preset)).num_params(exclude_embeddings=True)), preset
