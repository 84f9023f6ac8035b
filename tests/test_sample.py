"""sample.py end to end, on a checkpoint trained for a few steps here: greedy and sampled
text, stop strings, weight formats, damaged checkpoints, and settings refused before any
work. sample.py as a command: test_sample_cli.py; the text it streams:
test_sample_stream.py."""

import io
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

import sample
import train
from conf import CONF_DIR
from conf.sample_config import load_sample_config
from conftest import training_overrides
from data import CharTokenizer
from model.weight_formats import weight_format
from run.checkpoints import CheckpointError, find_checkpoint, load_checkpoint, write_digests
from run.load import checkpoint_model
from test_generate import reference_greedy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sample")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        train.train(compose(config_name="train", overrides=training_overrides(directory)))
    return directory / "runs"


def settings(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load_sample_config(compose(config_name="sample", overrides=list(overrides)))


def run_sample(runs_root: Path, *overrides: str) -> tuple[dict, str]:
    """sample.sample() on the newest run under runs_root: (result, printed text)."""
    out = io.StringIO()
    result = sample.sample(settings(f"runs_root={runs_root}", *overrides), out=out)
    return result, out.getvalue()


def greedy_text(runs_root: Path, prompt: str, max_new_tokens: int) -> str:
    """What the checkpoint continues with greedily, by the uncached reference loop."""
    checkpoint = load_checkpoint(find_checkpoint(None, runs_root))
    tokenizer = checkpoint.tokenizer()
    model = checkpoint_model(checkpoint, torch.device("cpu"), torch.float32)
    return tokenizer.decode(reference_greedy(model, tokenizer.encode(prompt), max_new_tokens))


def test_greedy_sample_is_the_checkpoints_greedy_continuation(runs_root):
    result, printed = run_sample(runs_root, "prompt=First", "temperature=0", "max_new_tokens=40")
    expected = greedy_text(runs_root, "First", 40)
    assert result["samples"] == [{"text": expected, "new_tokens": 40, "finish_reason": "length"}]
    assert printed == "First" + expected + "\n"
    assert result["checkpoint"].endswith("checkpoints/step_000030")  # the newest run's latest


def test_samples_stream_first_then_the_rest(runs_root):
    result, printed = run_sample(runs_root, "prompt=All", "num_samples=3", "max_new_tokens=30")
    texts = [s["text"] for s in result["samples"]]
    assert len(set(texts)) == 3  # sampled, not greedy
    assert printed == sample.SEPARATOR.join("All" + text for text in texts) + "\n"


def test_the_same_seed_gives_the_same_samples(runs_root):
    first, _ = run_sample(runs_root, "seed=3", "num_samples=2", "max_new_tokens=30")
    again, _ = run_sample(runs_root, "seed=3", "num_samples=2", "max_new_tokens=30")
    other, _ = run_sample(runs_root, "seed=4", "num_samples=2", "max_new_tokens=30")
    assert first["samples"] == again["samples"]
    assert first["samples"] != other["samples"]


def test_stop_strings_end_samples_and_are_left_out(runs_root):
    free = greedy_text(runs_root, "First", 60)
    stop = next(c for c in free[5:] if c.strip())  # a character the continuation will produce
    result, printed = run_sample(runs_root, "prompt=First", "temperature=0", "max_new_tokens=60", f"stop=[{stop!r}]")
    expected = free[: free.index(stop)]
    assert result["samples"][0]["text"] == expected
    assert result["samples"][0]["finish_reason"] == "stop"
    assert printed == "First" + expected + "\n"


def test_escaped_newline_in_stop_strings(runs_root):
    common = ("prompt=All", "seed=5", "max_new_tokens=120")
    free = run_sample(runs_root, *common)[0]["samples"][0]["text"]
    assert "\n" in free
    result, _ = run_sample(runs_root, *common, r'stop=["\n"]')  # a backslash and an n on the command line
    assert result["samples"][0]["text"] == free[: free.index("\n")]
    assert result["settings"]["stop"] == ["\n"]  # what was matched, not what was typed


def test_prompt_from_a_file(runs_root, tmp_path):
    (tmp_path / "prompt.txt").write_text("All: Speak")
    result, printed = run_sample(
        runs_root, f"prompt=FILE:{tmp_path / 'prompt.txt'}", "temperature=0", "max_new_tokens=10"
    )
    assert result["prompt"] == "All: Speak"
    assert printed.startswith("All: Speak")


def test_weights_load_without_unpickling(runs_root, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("sample.py must not unpickle anything")

    monkeypatch.setattr(torch, "load", refuse)
    result, _ = run_sample(runs_root, "max_new_tokens=5")
    assert result["samples"][0]["new_tokens"] == 5


def damaged_copy(runs_root: Path, tmp_path: Path, damage) -> Path:
    copy = tmp_path / "checkpoint"
    shutil.copytree(find_checkpoint(None, runs_root), copy)
    damage(copy)
    return copy


def set_config_value(section: str, key: str, value):
    """A checkpoint whose files are intact (their digests recorded anew) but do not fit together."""

    def damage(checkpoint: Path) -> None:
        config = yaml.safe_load((checkpoint / "config.yaml").read_text())
        config[section][key] = value
        (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
        write_digests(checkpoint)

    return damage


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda c: (c / "model.safetensors").write_bytes(b"not a safetensors file"), "does not match the sha256"),
        (lambda c: (c / "model.safetensors").unlink(), "no checkpoint at"),
        (set_config_value("model", "n_layer", 3), "checkpoint does not fit this model"),
        (set_config_value("model", "n_heads", 2), "invalid model section"),
        (set_config_value("tokenizer", "chars", "".join(chr(0x100 + i) for i in range(70))), "tokenizer has 70 ids"),
    ],
)
def test_corrupt_or_mismatched_checkpoints_are_explained(runs_root, tmp_path, damage, message):
    checkpoint = damaged_copy(runs_root, tmp_path, damage)
    with pytest.raises(CheckpointError, match=message):
        run_sample(runs_root, f"checkpoint={checkpoint}")


def test_a_checkpoint_with_non_finite_weights_is_named_not_sampled(runs_root, tmp_path):
    def poison(checkpoint: Path) -> None:
        weights = load_file(checkpoint / "model.safetensors")
        weights["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")
        save_file(weights, checkpoint / "model.safetensors")
        (checkpoint / "SHA256SUMS").unlink()  # as a run that diverged would have saved it (were it allowed to)

    checkpoint = damaged_copy(runs_root, tmp_path, poison)
    with pytest.raises(CheckpointError, match="holds non-finite weights .*transformer.h.0.mlp.c_fc.weight"):
        run_sample(runs_root, f"checkpoint={checkpoint}")


def test_unknown_characters_are_listed(runs_root):
    with pytest.raises(ValueError, match=r"does not know: 'Z' 'q' '€'"):
        run_sample(runs_root, "prompt='qZ€ First Z'")


def test_empty_prompt_starts_from_endoftext_or_a_newline():
    with_eot = CharTokenizer("\nab", with_eot=True)
    assert sample.encode_prompt(with_eot, "") == [with_eot.eot_id]
    without_eot = CharTokenizer("\nab", with_eot=False)
    assert sample.encode_prompt(without_eot, "") == without_eot.encode("\n")
    with pytest.raises(ValueError, match=r"does not know: '\\n'"):
        sample.encode_prompt(CharTokenizer("ab", with_eot=False), "")


@pytest.mark.parametrize(
    "override, message",
    [
        ("temperature=-0.5", "temperature must be"),
        ("top_p=0", r"top_p must be in \(0, 1\]"),
        ("top_p=1.5", r"top_p must be in \(0, 1\]"),
        ("top_k=0", "top_k must be >= 1, got 0"),
        ("num_samples=0", "num_samples must be >= 1, got 0"),
        ("max_new_tokens=0", "max_new_tokens must be >= 1, got 0"),
        ("precision=fp8", r"precision must be one of \('auto', 'fp32', 'bf16', 'fp16'\), got 'fp8'"),
        ("device=tpu", "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        ("device=cuda:x", "device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
        ("weights=int4", r"weights must be one of \('fp32', 'bf16', 'int8'\), got 'int4'"),
        ("decode=static", r"decode must be one of \('eager', 'graph'\), got 'static'"),
        ("stop=['']", "stop's every item must be a non-empty text"),
        ("+promt=hi", "promt is not a setting of SampleConfig; known: checkpoint, runs_root"),
        ("runs_root=", "runs_root must be a non-empty text, got ''"),
        ("seed=-1", r"seed must be in \[0, 4294967295\], got -1"),
        ("seed=99999999999999999999", r"seed must be in \[0, 4294967295\]"),
    ],
)
def test_invalid_settings_are_rejected_before_any_work(override, message):
    with pytest.raises(ValueError, match=message):
        settings(override)


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_weight_formats_sample_the_checkpoint_and_say_so(runs_root, weights):
    result, printed = run_sample(runs_root, "prompt=First", "temperature=0", "max_new_tokens=40", f"weights={weights}")
    assert result["settings"]["weights"] == weights
    assert result["samples"][0]["new_tokens"] == 40 and printed == "First" + result["samples"][0]["text"] + "\n"
    checkpoint = load_checkpoint(find_checkpoint(None, runs_root))
    assert weight_format(checkpoint_model(checkpoint, torch.device("cpu"), torch.float32, weights)) == weights


def test_int8_off_the_cpu_is_refused_before_the_checkpoint_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(sample, "resolve_device", lambda _: torch.device("meta"))  # any device but the CPU
    with pytest.raises(ValueError, match="weights=int8 runs on the CPU only .* on meta: use weights=bf16 there"):
        run_sample(tmp_path / "no-runs-here", "weights=int8")


def test_a_graph_off_cuda_is_refused_before_the_checkpoint_is_read(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"decode=graph replays CUDA graphs: it needs a CUDA device, "
        r"and this run is on cpu \(use decode=eager there\)",
    ):
        run_sample(tmp_path / "no-runs-here", "decode=graph", "device=cpu")


def test_an_empty_checkpoint_setting_is_not_the_current_directory(runs_root):
    with pytest.raises(
        CheckpointError, match="^checkpoint is empty: pass a checkpoint or run directory, or leave it unset$"
    ):
        run_sample(runs_root, "checkpoint=")


def test_missing_prompt_file_is_explained(runs_root, tmp_path):
    with pytest.raises(ValueError, match="cannot read the prompt file"):
        run_sample(runs_root, f"prompt=FILE:{tmp_path / 'absent.txt'}")


def test_a_batch_that_would_not_fit_in_memory_is_refused_before_generating(runs_root, monkeypatch):
    monkeypatch.setattr(sample, "available_memory", lambda device: 100)  # 100 bytes free
    monkeypatch.setattr(sample, "stream", lambda *args, **kwargs: pytest.fail("generation started"))
    with pytest.raises(
        ValueError,
        match=r"^num_samples=4 needs about 0\.0 GiB \(KV cache for \d+ positions, and each "
        r"step's logits\), and cpu has 0\.0 GiB available: lower num_samples$",
    ):
        run_sample(runs_root, "num_samples=4")


def test_the_memory_check_counts_the_cache_the_engine_allocates(make_model):
    from model import KVCache
    from run.runtime import available_memory

    for n_kv_head in (4, 1):
        config = make_model(n_kv_head=n_kv_head).config
        for dtype in (torch.float32, torch.bfloat16):
            assert KVCache.bytes_for(config, 3, 10, dtype) == KVCache(config, 3, 10, dtype=dtype).nbytes
    assert available_memory(torch.device("cpu")) > 2**20  # read from /proc/meminfo here
