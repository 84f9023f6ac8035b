"""sample.py init_from=hf: tiny random transformers models saved to a directory (no
network) continue a prompt as transformers' own greedy generate does, with every
sampling option, and tokenizers gptlab cannot read are refused before the weights."""

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import EntryNotFoundError
from tokenizers import Tokenizer as HfTokenizer
from tokenizers.models import WordLevel
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    NanoChatConfig,
    NanoChatForCausalLM,
)

import run.load
import sample
from conf.cli import prompt_from_words
from data import Gpt2Tokenizer
from data.bpe import train_bpe
from data.tokenizer import GPT2_FILES_DIR, GPT2_VOCAB_SIZE
from hf_reference import randomized
from run.checkpoints import CheckpointError
from test_sample import REPO, settings

EOT = GPT2_VOCAB_SIZE - 1
PROMPT = "Hello, I'm a language model,"
# GPT-2's real vocabulary (its tokenizer's ids must exist) on a model a few MB large.
GPT2_TINY = dict(vocab_size=GPT2_VOCAB_SIZE, n_positions=64, n_embd=32, n_layer=2, n_head=2)
LLAMA_TINY = dict(
    vocab_size=GPT2_VOCAB_SIZE,
    max_position_embeddings=64,
    hidden_size=32,
    intermediate_size=88,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
# NanoChatConfig's own defaults otherwise: rms_norm_eps 1e-6, a soft-cap of 15, an untied head.
NANOCHAT_TINY = dict(
    vocab_size=GPT2_VOCAB_SIZE,
    max_position_embeddings=64,
    hidden_size=32,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def save_gpt2_tokenizer(original: Path, directory: Path) -> None:
    """GPT-2's tokenizer in `directory` as transformers writes it (tokenizer.json by `tokenizers`),
    converted from OpenAI's two files under their Hub names in `original`."""
    original.mkdir()
    shutil.copyfile(GPT2_FILES_DIR / "encoder.json", original / "vocab.json")
    shutil.copyfile(GPT2_FILES_DIR / "vocab.bpe", original / "merges.txt")
    GPT2TokenizerFast.from_pretrained(original).save_pretrained(directory)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """family -> (its transformers directory, the transformers model saved there)."""
    root = tmp_path_factory.mktemp("hf")
    special = dict(bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT)
    saved = {
        "gpt2": randomized(GPT2LMHeadModel(GPT2Config(**GPT2_TINY, **special)), seed=1),
        "llama": randomized(LlamaForCausalLM(LlamaConfig(**LLAMA_TINY, **special)), seed=2),
        "nanochat": randomized(NanoChatForCausalLM(NanoChatConfig(**NANOCHAT_TINY, **special)), seed=3),
    }
    for family, model in saved.items():
        model.save_pretrained(root / family)
    save_gpt2_tokenizer(root / "openai", root / "llama")  # a Llama or NanoChat directory must hold its tokenizer
    shutil.copyfile(root / "llama" / "tokenizer.json", root / "nanochat" / "tokenizer.json")
    return {family: (root / family, model) for family, model in saved.items()}


def run_hf(model_path, *words: str) -> tuple[dict, str]:
    """sample.sample() on an imported model, given settings and prompt words as on the command line."""
    out = io.StringIO()
    overrides = prompt_from_words(["init_from=hf", f"model_path={model_path}", *words])
    result = sample.sample(settings(*overrides), out=out)
    return result, out.getvalue()


@torch.no_grad()
def transformers_greedy(model: torch.nn.Module, prompt: str, max_new_tokens: int) -> str:
    """The independent reference: transformers' own greedy generate, decoded by GPT-2's tokenizer."""
    tokenizer = Gpt2Tokenizer()
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(token for token in out[0, ids.shape[1] :].tolist() if token != EOT)


@pytest.mark.parametrize(
    "family, greedy", [("gpt2", "temperature=0"), ("llama", "top_k=1"), ("nanochat", "temperature=0")]
)
def test_greedy_sample_is_transformers_greedy_generate(models, family, greedy):
    directory, model = models[family]
    result, printed = run_hf(directory, PROMPT, greedy, "max_new_tokens=16")
    expected = transformers_greedy(model, PROMPT, 16)
    assert result["samples"] == [{"text": expected, "new_tokens": 16, "finish_reason": "length"}]
    assert printed == PROMPT + expected + "\n" and result["checkpoint"] == str(directory)


def test_the_command_line_streams_a_local_directory(models, tmp_path):
    directory, model = models["gpt2"]
    process = subprocess.run(
        [
            sys.executable,
            str(REPO / "sample.py"),
            "init_from=hf",
            f"model_path={directory}",
            PROMPT,
            "temperature=0",
            "max_new_tokens=8",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout == PROMPT + transformers_greedy(model, PROMPT, 8) + "\n"


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_sampling_options_work_on_an_imported_model(models, weights):
    directory, _ = models["llama"]
    common = ("prompt=Once", "top_k=50", "top_p=0.9", "temperature=1.5", "max_new_tokens=16", f"weights={weights}")
    batch, _ = run_hf(directory, *common, "num_samples=3", "seed=4")
    assert len({s["text"] for s in batch["samples"]}) == 3 and batch["settings"]["weights"] == weights
    free = run_hf(directory, *common)[0]["samples"][0]["text"]
    stop = re.findall("[A-Za-z]{2}", free[len(free) // 2 :])[0]  # two letters from its second half
    stopped, printed = run_hf(directory, *common, f"stop=[{stop}]")
    assert stopped["samples"][0]["text"] == free[: free.index(stop)]
    assert stopped["samples"][0]["finish_reason"] == "stop"
    assert printed == "Once" + free[: free.index(stop)] + "\n"


def fake_hub(monkeypatch, hub: Path, cache: Path) -> None:
    """hf_hub_download as the Hub's cache does it, offline: a file of a repository in `hub`
    is copied into `cache` on request, and only those requested are there."""

    def download(repo_id: str, filename: str) -> str:
        if not (hub / repo_id / filename).is_file():
            raise EntryNotFoundError(f"{repo_id} has no {filename}")
        (cache / repo_id).mkdir(parents=True, exist_ok=True)
        return shutil.copy(hub / repo_id / filename, cache / repo_id / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)


def test_a_hub_name_fetches_the_tokenizer_with_the_weights(models, tmp_path, monkeypatch):
    directory, model = models["llama"]
    fake_hub(monkeypatch, hub=directory.parent.parent, cache=tmp_path / "cache")
    monkeypatch.chdir(tmp_path)  # the name is not a local directory here
    repo_id = "/".join(directory.parts[-2:])  # "<the fixture's folder>/llama"
    result, _ = run_hf(repo_id, PROMPT, "temperature=0", "max_new_tokens=4")
    assert result["samples"][0]["text"] == transformers_greedy(model, PROMPT, 4)


def test_a_hub_name_offline_and_not_cached_is_explained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="'gptlab-tests/no-such-model' is not a local directory.*offline"):
        run_hf("gptlab-tests/no-such-model")


def other_tokenizer(directory: Path) -> None:
    HfTokenizer(WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(directory / "tokenizer.json"))


@pytest.mark.parametrize(
    "tokenizer, message",
    [
        (lambda directory: None, "has no tokenizer.json, where a 'llama' model's tokenizer is read from"),
        (
            other_tokenizer,
            "tokenizer.json is neither GPT-2's tokenizer nor a byte-level BPE as data.tokenizer=bpe trains",
        ),
    ],
)
def test_a_llama_tokenizer_gptlab_cannot_read_is_refused_before_the_weights(
    models, tmp_path, monkeypatch, tokenizer, message
):
    directory = tmp_path / "llama"
    models["llama"][1].save_pretrained(directory)
    tokenizer(directory)
    monkeypatch.setattr(run.load, "load_hf_pretrained", lambda *args: pytest.fail("the weights were read"))
    with pytest.raises(CheckpointError, match=message):
        run_hf(directory)


def test_a_tokenizer_with_far_fewer_ids_than_the_model_is_refused(models, tmp_path):
    """A valid 300-id BPE beside a 50,257-id model would decode most generated ids as nothing."""
    directory = tmp_path / "llama"
    models["llama"][1].save_pretrained(directory)
    tokenizer = train_bpe(["some text to learn from " * 50], 300)  # stops short of 300: few pairs to merge
    (directory / "tokenizer.json").write_text(tokenizer.json)
    with pytest.raises(
        CheckpointError,
        match=rf"its model has {GPT2_VOCAB_SIZE} ids but its tokenizer.json only "
        rf"{tokenizer.vocab_size}: ",
    ):
        run_hf(directory)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ("init_from=hf", "model_path=gpt2", "checkpoint=runs/x"),
            r"^checkpoint=runs/x and init_from=hf name two models: sample a gptlab checkpoint with checkpoint=PATH",
        ),
        (("init_from=hf",), "^init_from=hf needs model_path: a transformers directory or a Hub name such as gpt2$"),
        (("model_path=gpt2",), "^model_path=gpt2 is read only with init_from=hf: set init_from=hf too"),
        (("init_from=hub",), r"^init_from must be one of \('checkpoint', 'hf'\), got 'hub'$"),
    ],
)
def test_conflicting_or_missing_model_settings_are_one_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        settings(*overrides)
