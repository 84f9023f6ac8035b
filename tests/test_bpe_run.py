"""A run on the corpus's own tokenizer (data.tokenizer=bpe): train.py keeps it in every
checkpoint, sample.py and the lm-eval class read it there, and the export hands it to
transformers, which encodes text to the same ids."""

import io
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import data.preparation
import export
import sample
import train
from conf import CONF_DIR
from conftest import training_overrides
from data import DataError
from data.bpe import TOKENIZER_FILE
from run.checkpoints import DIGESTS, find_checkpoint, load_checkpoint
from run.load import checkpoint_model
from test_generate import reference_greedy
from test_sample import settings

PYTHON = Path(data.preparation.__file__).read_text(encoding="utf-8")
TEXT = "def f(x):\n        return x  # naïve 🤖\n\tpass"  # no literal <|endoftext|>: transformers reads it as eot


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bpe_run")
    corpus = directory / "python.txt"
    corpus.write_text(PYTHON, encoding="utf-8")
    replaced = {"data.path": str(corpus), "data.tokenizer": "bpe", "max_iters": "2", "eval_interval": "2"}
    overrides = [o for o in training_overrides(directory) if o.split("=")[0] not in replaced]
    overrides += [f"{key}={value}" for key, value in replaced.items()] + ["data.vocab_size=512"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return train.train(compose(config_name="train", overrides=overrides))


def test_every_checkpoint_holds_the_tokenizer_that_its_config_names(run_dir):
    checkpoint = load_checkpoint(find_checkpoint(run_dir, run_dir.parent))
    description = checkpoint.config["tokenizer"]
    assert description["name"] == "bpe" and description["vocab_size"] == 512 == checkpoint.model_config.vocab_size
    prepared = Path(checkpoint.config["data"]["data_dir"]) / TOKENIZER_FILE
    assert (checkpoint.path / TOKENIZER_FILE).read_bytes() == prepared.read_bytes()
    assert TOKENIZER_FILE in (checkpoint.path / DIGESTS).read_text()  # sha256sum -c checks it too
    assert checkpoint.tokenizer().decode(checkpoint.tokenizer().encode(TEXT)) == TEXT


def test_sample_decodes_with_the_runs_tokenizer(run_dir, tmp_path):
    result = sample.sample(
        settings(f"checkpoint={run_dir}", "prompt=def", "temperature=0", "max_new_tokens=12"), out=io.StringIO()
    )
    checkpoint = load_checkpoint(find_checkpoint(run_dir, run_dir.parent))
    tokenizer = checkpoint.tokenizer()
    model = checkpoint_model(checkpoint, torch.device("cpu"), torch.float32)
    assert result["samples"][0]["text"] == tokenizer.decode(reference_greedy(model, tokenizer.encode("def"), 12))
    copy = tmp_path / "copy"
    shutil.copytree(checkpoint.path, copy)
    (copy / TOKENIZER_FILE).unlink()
    with pytest.raises(DataError, match=f"cannot read {copy / TOKENIZER_FILE}"):
        sample.sample(settings(f"checkpoint={copy}", "max_new_tokens=1"), out=io.StringIO())


def test_export_writes_a_tokenizer_json_that_transformers_reads_to_the_same_ids(run_dir, tmp_path):
    export.main([str(run_dir), str(tmp_path / "hf")])
    tokenizer = load_checkpoint(find_checkpoint(run_dir, run_dir.parent)).tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / TOKENIZER_FILE))
    auto = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in (TEXT, PYTHON[:2000]):
        assert fast.encode(text) == auto.encode(text) == tokenizer.encode(text)
    assert auto.eos_token_id == tokenizer.eot_id and auto.decode(tokenizer.encode(TEXT)) == TEXT


def test_sample_init_from_hf_reads_the_exported_bpe_and_continues_as_the_run_does(run_dir, tmp_path):
    export.main([str(run_dir), str(tmp_path / "hf")])
    greedy = ("prompt=def", "temperature=0", "max_new_tokens=12")
    from_run = sample.sample(settings(f"checkpoint={run_dir}", *greedy), out=io.StringIO())
    from_hf = sample.sample(settings("init_from=hf", f"model_path={tmp_path / 'hf'}", *greedy), out=io.StringIO())
    assert from_hf["samples"][0]["text"] == from_run["samples"][0]["text"]
