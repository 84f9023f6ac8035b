"""Exporting checkpoints to transformers: the loaded models compute our logits, the
round trip is lossless, the gpt2 tokenizer comes along, and GQA is refused."""

import errno
from dataclasses import asdict
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel, GPTBigCodeForCausalLM

import export
import hf.files
from data import load_tokenizer
from hf.files import HFError, load_hf_pretrained, save_hf
from hf_reference import assert_same_logits, hf_bigcode, hf_gpt2, randomized
from model import GPT, GPTConfig, Sampling, generate
from run.checkpoints import Checkpoints

CHAR_TOKENIZER = {"name": "char", "chars": "abcdefgh", "eot": True}  # eot id 8
SAMPLE_TEXT = "Hello world! It's 2024: naïve café,   spaces\n\n\ttabs, émojis 🤖 and 1234567 numbers."


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def save_run(run_dir, tokenizer, seed=0, **config) -> GPT:
    """A checkpoint of a randomly initialised GPT (biases and gains random too) in run_dir."""
    torch.manual_seed(seed)
    model = randomized(GPT(GPTConfig(dropout=0.0, **config)), seed)
    run_config = {"model": asdict(model.config), "data": {}, "tokenizer": tokenizer}
    Checkpoints(run_dir).save(1, model, run_config, state={})
    return model


SMALL = dict(vocab_size=1000, block_size=64, n_layer=2, n_head=4, n_embd=64)


@pytest.mark.parametrize("match_mha_params", [False, True])  # True widens an MQA model's MLP
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n_kv_head, reference_class", [(4, GPT2LMHeadModel), (1, GPTBigCodeForCausalLM)])
def test_exported_model_loads_in_transformers_with_our_logits(
    tmp_path, n_kv_head, reference_class, bias, match_mha_params, capsys
):
    model = save_run(
        tmp_path / "run", CHAR_TOKENIZER, n_kv_head=n_kv_head, bias=bias, match_mha_params=match_mha_params, **SMALL
    )
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])  # a run directory: its latest checkpoint
    assert reference_class.__name__ in capsys.readouterr().out
    reference = reference_class.from_pretrained(tmp_path / "hf").eval()
    assert_same_logits(model, reference)
    assert reference.config.eos_token_id == 8  # the char tokenizer's end-of-text


@pytest.mark.parametrize("bias", [True, False])  # False: zero biases are added, and none for the head
@pytest.mark.parametrize("mlp", ["gelu", "relu2"])
@pytest.mark.parametrize("n_kv_head, reference_class", [(4, GPT2LMHeadModel), (1, GPTBigCodeForCausalLM)])
def test_relu2_and_an_untied_head_export_with_our_logits_and_import_back(
    tmp_path, n_kv_head, reference_class, mlp, bias
):
    model = save_run(
        tmp_path / "run", CHAR_TOKENIZER, n_kv_head=n_kv_head, mlp=mlp, bias=bias, tie_embeddings=False, **SMALL
    )
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    reference = reference_class.from_pretrained(tmp_path / "hf").eval()
    assert reference.lm_head.weight.data_ptr() != reference.get_input_embeddings().weight.data_ptr()
    assert_same_logits(model, reference)
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert (config.mlp, config.tie_embeddings) == (mlp, False)
    assert torch.equal(state["lm_head.weight"], model.lm_head.weight)


def test_widened_multi_query_model_imports_back_as_itself(tmp_path):
    model = save_run(tmp_path / "run", CHAR_TOKENIZER, n_kv_head=1, match_mha_params=True, **SMALL)
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    config, state = load_hf_pretrained(tmp_path / "hf")
    assert config == model.config
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items() if name in state)


def test_padded_vocab_exports_as_is_with_the_gpt2_tokenizer(tmp_path):
    model = save_run(
        tmp_path / "run", {"name": "gpt2"}, vocab_size=50304, block_size=32, n_layer=1, n_head=2, n_embd=32
    )
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    reference = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (reference.config.vocab_size, len(tokenizer)) == (50304, 50257)
    assert_same_logits(model, reference, length=32)


def test_exported_gpt2_tokenizer_encodes_like_ours(tmp_path):
    save_run(tmp_path / "run", {"name": "gpt2"}, vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=32)
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    theirs, ours = AutoTokenizer.from_pretrained(tmp_path / "hf"), load_tokenizer({"name": "gpt2"})
    assert theirs(SAMPLE_TEXT)["input_ids"] == ours.encode(SAMPLE_TEXT)
    assert theirs.decode(ours.encode(SAMPLE_TEXT)) == SAMPLE_TEXT
    assert theirs.eos_token_id == ours.eot_id == theirs("<|endoftext|>")["input_ids"][0]
    assert theirs.model_max_length == 32


@pytest.mark.parametrize("n_kv_head, model_type", [(2, "gpt2"), (1, "gpt_bigcode")])
def test_mha_and_mqa_exports_load_with_the_auto_classes_and_generate_our_tokens(
    tmp_path, capsys, n_kv_head, model_type
):
    model = save_run(
        tmp_path / "run",
        {"name": "gpt2"},
        vocab_size=50257,
        block_size=32,
        n_layer=1,
        n_head=2,
        n_kv_head=n_kv_head,
        n_embd=32,
    )
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "tokenizer.json" in capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")  # fast-only for gpt_bigcode: needs tokenizer.json
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert reference.config.model_type == model_type
    prompt = tokenizer("Hello world, it's", return_tensors="pt")
    theirs = reference.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    [ours] = generate(model.eval(), [prompt["input_ids"][0].tolist()], 8, Sampling(temperature=0))
    assert theirs[0, prompt["input_ids"].shape[1] :].tolist() == ours
    assert tokenizer.decode(ours) == load_tokenizer({"name": "gpt2"}).decode(ours)


def test_char_tokenizer_is_not_exported_but_the_weights_are(tmp_path, capsys):
    save_run(tmp_path / "run", CHAR_TOKENIZER, **SMALL)
    export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "tokenizer (char) not exported" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]


def test_grouped_query_attention_is_refused(tmp_path):
    save_run(tmp_path / "run", CHAR_TOKENIZER, n_kv_head=2, **SMALL)
    with pytest.raises(SystemExit, match="grouped-query attention .* has no GPT-2-family equivalent"):
        export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()


def test_a_non_empty_output_directory_is_refused(tmp_path):
    save_run(tmp_path / "run", CHAR_TOKENIZER, **SMALL)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="is not empty"):
        export.main([str(tmp_path / "run"), str(tmp_path / "hf")])


@pytest.mark.parametrize(
    "place, message",
    [
        (lambda tmp: tmp / "a_file" / "hf", "cannot write the export to .*/a_file/hf: Not a directory"),
        (lambda tmp: tmp / "a_file", "a_file is a file: export into a new or empty directory"),
        (lambda tmp: Path("/proc/gptlab_export"), "cannot write the export to /proc/gptlab_export"),
    ],
)
def test_an_output_path_that_cannot_hold_the_export_is_named(tmp_path, place, message):
    save_run(tmp_path / "run", CHAR_TOKENIZER, **SMALL)
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(SystemExit, match=message):
        export.main([str(tmp_path / "run"), str(place(tmp_path))])
    assert (tmp_path / "a_file").read_text() == "mine"


def test_a_full_disk_during_export_leaves_no_half_written_model(tmp_path, monkeypatch):
    save_run(tmp_path / "run", CHAR_TOKENIZER, **SMALL)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf.files, "save_file", full)
    with pytest.raises(SystemExit, match="cannot write the export to .*hf: No space left on device"):
        export.main([str(tmp_path / "run"), str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("out_dir_before", ["absent", "empty"])
def test_an_export_killed_before_its_tokenizer_files_leaves_no_finished_looking_directory(
    tmp_path, monkeypatch, out_dir_before
):
    out_dir = tmp_path / "hf"
    if out_dir_before == "empty":
        out_dir.mkdir()
    config = GPTConfig(vocab_size=50257, block_size=32, n_layer=1, n_head=2, n_embd=32)
    state, gpt2 = GPT(config).state_dict(), load_tokenizer({"name": "gpt2"})
    seen_at_the_kill = []

    def killed(directory, model_max_length):  # the weights are written; a signal lands here
        seen_at_the_kill.append(sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else None)
        raise KeyboardInterrupt

    monkeypatch.setattr(hf.files, "_save_gpt2_tokenizer", killed)
    with pytest.raises(KeyboardInterrupt):
        save_hf(out_dir, config, state, gpt2)
    untouched = None if out_dir_before == "absent" else []
    assert seen_at_the_kill == [untouched]  # a SIGKILL there leaves out_dir as it was, the weights elsewhere
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if untouched is None else ["hf"])
    assert (sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else None) == untouched

    monkeypatch.undo()
    save_hf(out_dir, config, state, gpt2)
    exported = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json"} <= set(exported)
    with pytest.raises(HFError, match="is not empty"):  # a finished export is never written over
        save_hf(out_dir, config, state, gpt2)
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == exported


def test_a_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint at"):
        export.main([str(tmp_path / "nothing"), str(tmp_path / "hf")])


@pytest.mark.parametrize("make_reference", [hf_gpt2, hf_bigcode])
def test_import_export_import_is_lossless(tmp_path, make_reference):
    make_reference().save_pretrained(tmp_path / "original")
    config, state = load_hf_pretrained(tmp_path / "original")
    save_hf(tmp_path / "exported", config, state)
    config_again, state_again = load_hf_pretrained(tmp_path / "exported")
    assert config_again == config
    assert state_again.keys() == state.keys()
    assert all(torch.equal(state_again[name], state[name]) for name in state)
    # The exported file holds what transformers itself wrote, tensor for tensor.
    original, exported = (load_file(tmp_path / d / "model.safetensors") for d in ("original", "exported"))
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)
