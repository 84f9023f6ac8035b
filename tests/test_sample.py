"""sample.py end to end, on a checkpoint trained for a few steps here."""

import io
import json
import random
import shutil
import signal
import subprocess
import sys
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
from data import CharTokenizer, Gpt2Tokenizer, Tokenizer
from model import cut_at_stop, stop_string_check
from model.weight_formats import weight_format
from run.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, write_digests
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
    result, printed = run_sample(runs_root, f"prompt=FILE:{tmp_path / 'prompt.txt'}", "temperature=0", "max_new_tokens=10")
    assert result["prompt"] == "All: Speak"
    assert printed.startswith("All: Speak")


def test_weights_load_without_unpickling(runs_root, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("sample.py must not unpickle anything")

    monkeypatch.setattr(torch, "load", refuse)
    result, _ = run_sample(runs_root, "max_new_tokens=5")
    assert result["samples"][0]["new_tokens"] == 5


def test_json_output_from_the_command_line(runs_root, tmp_path):
    process = subprocess.run(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={runs_root}", "num_samples=2", "max_new_tokens=12",
         "json=true", "prompt=All"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr
    result = json.loads(process.stdout)
    assert result["prompt"] == "All" and result["settings"]["seed"] == 1337
    assert [s["new_tokens"] for s in result["samples"]] == [12, 12]


def test_missing_checkpoint_says_where_it_looked_and_how_to_train(tmp_path):
    process = subprocess.run(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={tmp_path / 'runs'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert process.returncode == 1
    assert f"error: no checkpoint found under {tmp_path / 'runs'}" in process.stderr
    assert "python train.py" in process.stderr and "checkpoint=PATH" in process.stderr


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
    with pytest.raises(ValueError, match=r"decode=graph replays CUDA graphs: it needs a CUDA device, and this run is on cpu \(use decode=eager there\)"):
        run_sample(tmp_path / "no-runs-here", "decode=graph", "device=cpu")


def test_an_empty_checkpoint_setting_is_not_the_current_directory(runs_root):
    with pytest.raises(CheckpointError, match="^checkpoint is empty: pass a checkpoint or run directory, or leave it unset$"):
        run_sample(runs_root, "checkpoint=")


def test_missing_prompt_file_is_explained(runs_root, tmp_path):
    with pytest.raises(ValueError, match="cannot read the prompt file"):
        run_sample(runs_root, f"prompt=FILE:{tmp_path / 'absent.txt'}")


def test_live_text_holds_back_what_may_still_change():
    out = io.StringIO()
    live = sample.LiveText(out, stops=["\n\n", "END"])
    for token_bytes, printed in [
        (b"ab", "ab"),
        (b"\n", "ab"),  # the newline may become "\n\n"
        (b"EN", "ab\n"),  # "EN" may become "END"
        (b"x\xc3", "ab\nENx"),  # the first byte of an unfinished character
        (b"\xa9\n\nmore", "ab\nENx\u00e9"),  # never a stop string or what follows it
        (b"END", "ab\nENx\u00e9"),
    ]:
        live.add(token_bytes)
        assert out.getvalue() == printed
    live.finish("ab\nENx\u00e9")
    assert out.getvalue() == "ab\nENx\u00e9"


MULTIBYTE_STOPS = ["\n\n", "caf\u00e9", "\u65e5\u672c", "\U0001F600", "END"]


def multibyte_tokens(text_end: str) -> tuple[Tokenizer, list[int]]:
    """GPT-2 tokens of a text whose characters are split across tokens (byte-level BPE)."""
    tokenizer = Gpt2Tokenizer()
    words = ["na\u00efve", "caf", "\u00e9", "\u65e5\u672c\u8a9e", "\U0001F600", "\u2014", "\n", "E", "ND", "plain"]
    rng = random.Random(0)
    text = "".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(400)) + text_end
    ids = tokenizer.encode(text)
    assert any(UNFINISHED in tokenizer.decode(ids[:i]) for i in range(1, 50))  # a character split across tokens
    return tokenizer, ids


UNFINISHED = "\ufffd"


def reference_live_text(text: str, stops: list[str]) -> str:
    """What may be printed of the whole decoded text so far: up to a stop string, without a
    trailing unfinished character or the start of a stop string."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    if found:
        return text[:min(found)]
    text = text.rstrip(UNFINISHED)
    held = max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
    return text[: len(text) - held]


def test_live_text_prints_what_the_whole_decoded_text_allows_token_by_token():
    tokenizer, ids = multibyte_tokens("")
    stops = ["END", "\n\n", "\u65e5\u672c\u8a9e\U0001F600\U0001F600"]  # the text has the first only, at 519
    out = io.StringIO()
    live = sample.LiveText(out, stops)
    for i, token in enumerate(ids, 1):
        live.add(tokenizer.decode_bytes([token]))
        assert out.getvalue() == reference_live_text(tokenizer.decode(ids[:i]), stops)
    whole = cut_at_stop(tokenizer.decode(ids), stops)[0]
    live.finish(whole)
    assert out.getvalue() == whole and len(whole) == 519


@pytest.mark.parametrize("stop", MULTIBYTE_STOPS)
def test_the_windowed_stop_check_ends_a_sample_where_the_whole_text_check_would(stop):
    tokenizer, ids = multibyte_tokens(stop)
    check = stop_string_check(tokenizer.decode, [stop, "zz"])
    first = next(i for i in range(1, len(ids) + 1) if check(ids[:i]))
    expected = next(i for i in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:i]))
    assert first == expected


@pytest.mark.parametrize("stop", ["END", "caf\u00e9", "\U0001F600"])
def test_the_stop_check_finds_a_stop_spelt_one_byte_per_token(stop):
    tokenizer = Gpt2Tokenizer()
    byte_token = {tokenizer.decode_bytes([i]): i for i in range(256 * 4)}  # GPT-2's first ids: the 256 bytes
    ids = [byte_token[bytes([b])] for b in ("so " + stop).encode("utf-8")]
    check = stop_string_check(tokenizer.decode, [stop])
    assert [check(ids[:i]) for i in range(1, len(ids) + 1)] == [False] * (len(ids) - 1) + [True]


@pytest.mark.parametrize("text", [
    "it's, a (test) [with] {brackets}", 'def main(', 'He said "hi", then left', "back\\slash and \\n escapes",
    "cost ${x} = 3", "ends in a backslash\\", "quote after a backslash \\'", "x = 1, with spaces",
])
def test_plain_words_reach_the_prompt_as_typed(text):
    from conf.cli import prompt_from_words

    args = prompt_from_words([text, "max_new_tokens=3"])
    assert args[0] == "max_new_tokens=3"
    assert settings(*args).prompt == text


def sample_cli(*args, cwd, **kwargs):
    return subprocess.run([sys.executable, str(REPO / "sample.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_a_prompt_as_plain_words_or_from_stdin(runs_root, tmp_path):
    words = sample_cli("All: Speak, speak", f"runs_root={runs_root}", "max_new_tokens=3", "json=true", cwd=tmp_path)
    assert words.returncode == 0, words.stderr
    assert json.loads(words.stdout)["prompt"] == "All: Speak, speak"
    assert "sampling from " in words.stderr  # which run was picked
    piped = sample_cli("prompt=-", f"runs_root={runs_root}", "max_new_tokens=3", "json=true", cwd=tmp_path,
                       input="First Citizen, hear me")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["prompt"] == "First Citizen, hear me"


def test_a_reader_that_leaves_early_is_not_an_error(runs_root, tmp_path):
    process = subprocess.Popen([sys.executable, str(REPO / "sample.py"), f"runs_root={runs_root}",
                                "max_new_tokens=400"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.read(1)  # `| head -c 1`: the reader leaves while the text still streams
    process.stdout.close()
    stderr = process.communicate(timeout=120)[1].decode()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr


def test_nested_and_section_names_are_checked_too():
    from conf import Config
    from conf.cli import unknown_setting

    assert unknown_setting("optim.lr", Config).startswith("optim.lr is not a setting of OptimConfig; known: name, learning_rate")
    assert unknown_setting("seed.x", Config) == "seed is a value, not a section: it has no x"
    assert unknown_setting("logging.wandb.mode", Config) is None and unknown_setting("model.n_kv_head", Config) is None


def test_ctrl_c_while_sampling_keeps_what_was_printed_and_exits_quietly(runs_root):
    process = subprocess.Popen(
        [sys.executable, str(REPO / "sample.py"), f"runs_root={runs_root}", "prompt=First", "max_new_tokens=100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert process.stdout.read(len("First") + 20).startswith("First")  # generating by now
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT
    assert stderr.strip().endswith("interrupted") and "Traceback" not in stderr


def test_a_batch_that_would_not_fit_in_memory_is_refused_before_generating(runs_root, monkeypatch):
    monkeypatch.setattr(sample, "available_memory", lambda device: 100)  # 100 bytes free
    monkeypatch.setattr(sample, "stream", lambda *args, **kwargs: pytest.fail("generation started"))
    with pytest.raises(ValueError, match=r"^num_samples=4 needs about 0\.0 GiB \(KV cache for \d+ positions, and each "
                                         r"step's logits\), and cpu has 0\.0 GiB available: lower num_samples$"):
        run_sample(runs_root, "num_samples=4")


def test_the_memory_check_counts_the_cache_the_engine_allocates(make_model):
    from model import KVCache
    from run.runtime import available_memory

    for n_kv_head in (4, 1):
        config = make_model(n_kv_head=n_kv_head).config
        for dtype in (torch.float32, torch.bfloat16):
            assert KVCache.bytes_for(config, 3, 10, dtype) == KVCache(config, 3, 10, dtype=dtype).nbytes
    assert available_memory(torch.device("cpu")) > 2**20  # read from /proc/meminfo here
