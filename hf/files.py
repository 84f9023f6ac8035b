"""Hugging Face directories in and out of gptlab (the conversions: hf/gpt2.py, hf/llama.py, hf/nanochat.py).

`load_hf_pretrained` reads a transformers directory or a Hub name into a GPTConfig and a state dict, `hf_tokenizer`
its tokenizer; `save_hf` writes a GPTConfig and its state dict as a directory that transformers loads, with the
tokenizer's files for gpt2 and a trained bpe. Nothing here knows gptlab's runs: run/ reads these directories
(init_from=hf, load_model) and export.py writes a checkpoint through save_hf. Every refusal is an HFError.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from data.bpe import BpeTokenizer
from data.errors import DataError
from data.tokenizer import EOT_TEXT, GPT2_FILES_DIR, Gpt2Tokenizer, Tokenizer
from hf import nanochat
from hf.gpt2 import ARCHITECTURE_CLASS, crop_block_size, from_hf, pool_kv_heads, to_hf
from model import GPTConfig
from system import UserError, temp_path

HF_CONFIG, HF_SAFETENSORS, HF_PICKLE = "config.json", "model.safetensors", "pytorch_model.bin"
HF_TOKENIZER = "tokenizer.json"  # the `tokenizers` library's one-file form
HUB_NAME = re.compile(r"^[\w.-]+(/[\w.-]+)?$")  # a Hub repository id: "name" or "owner/name"


class HFError(UserError):
    """A Hugging Face model cannot be read, converted or written; the message says why."""


def load_hf_pretrained(
    model_path: str | Path, n_kv_head: int | None = None, block_size: int | None = None
) -> tuple[GPTConfig, dict[str, Tensor]]:
    """GPT-2-family, Llama or NanoChat weights as (GPTConfig, state dict) from model_path, a local transformers
    directory or a Hub name such as "gpt2" (through the Hugging Face cache; offline, only what is cached). n_kv_head:
    fewer key/value heads, mean-pooled (hf.gpt2.pool_kv_heads); block_size: a shorter context; None keeps theirs.
    Dropout is 0.0 and attn_impl "sdpa" (dataclasses.replace changes them). HFError with the reason on any failure."""
    directory = resolve_hf_dir(str(model_path))
    hf_config, hf_state = _read_hf_config(directory), _read_hf_weights(directory)
    try:
        config, state = from_hf(hf_config, hf_state)
        if n_kv_head is not None and n_kv_head != config.kv_heads:
            config, state = pool_kv_heads(state, config, n_kv_head)
        if block_size is not None and block_size != config.block_size:
            config, state = crop_block_size(state, config, block_size)
    except ValueError as err:
        raise HFError(f"cannot import {directory}: {err}") from err
    return config, state


def resolve_hf_dir(model_path: str) -> Path:
    """A local directory as it is; a Hub name that is no local path fetched from the Hub (or its cache)."""
    return local_hf_dir(model_path) or _download(model_path)


def local_hf_dir(model_path: str) -> Path | None:
    """model_path as a local directory, None for a Hub name; HFError for neither."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HFError(f"{model_path} is a file: pass the directory holding {HF_CONFIG} and the weights")
    if not HUB_NAME.match(model_path):
        raise HFError(f"no directory {model_path}")
    return None


def _download(repo_id: str) -> Path:
    from huggingface_hub import errors, hf_hub_download  # with datasets and transformers; only Hub names need it

    where = f"{repo_id!r} is not a local directory, so it was looked up on the Hugging Face Hub"
    try:
        config_file = Path(hf_hub_download(repo_id, HF_CONFIG))
        try:
            hf_hub_download(repo_id, HF_SAFETENSORS)
        except errors.EntryNotFoundError:
            hf_hub_download(repo_id, HF_PICKLE)
        with contextlib.suppress(errors.EntryNotFoundError):  # what hf_tokenizer reads; a model without one imports
            hf_hub_download(repo_id, HF_TOKENIZER)
    except errors.LocalEntryNotFoundError as err:  # offline (HF_HUB_OFFLINE or no network) and not cached
        raise HFError(
            f"{where}, which cannot be reached (offline), and it is not in the local cache: download it "
            f"where there is a network (e.g. `hf download {repo_id}`) and pass its local directory"
        ) from err
    except errors.RepositoryNotFoundError as err:
        raise HFError(f"{where}: no such model there (or it is private or gated)") from err
    except errors.EntryNotFoundError as err:
        raise HFError(f"{where}: it has no {HF_CONFIG}, or neither {HF_SAFETENSORS} nor {HF_PICKLE}") from err
    except errors.HfHubHTTPError as err:
        raise HFError(f"{where}: the Hub answered {err}") from err
    return config_file.parent  # the files of one revision share a snapshot directory


def _read_hf_config(directory: Path) -> dict:
    path = directory / HF_CONFIG
    if not path.is_file():
        raise HFError(f"{directory} has no {HF_CONFIG}: not a transformers model directory")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise HFError(f"cannot read {path}: {err}") from err
    if not isinstance(config, dict):
        raise HFError(f"{path} is not a JSON object")
    return config


def _read_hf_weights(directory: Path) -> dict[str, Tensor]:
    """model.safetensors, else pytorch_model.bin unpickled with weights_only=True (no code runs on load)."""
    safetensors_file, pickle_file = directory / HF_SAFETENSORS, directory / HF_PICKLE
    if safetensors_file.is_file():
        try:
            return load_file(safetensors_file)
        except (SafetensorError, OSError) as err:
            raise HFError(f"cannot read {safetensors_file}: {err}") from err
    if not pickle_file.is_file():
        raise HFError(
            f"{directory} has no weights: expected {HF_SAFETENSORS} or {HF_PICKLE} (sharded weights are not supported)"
        )
    try:
        state = torch.load(pickle_file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged or unsafe pickles
        raise HFError(f"cannot load {pickle_file} as plain tensors (weights_only=True): {err}") from err
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise HFError(f"{pickle_file} is not a state dict of tensors")
    return state


def hf_tokenizer(directory: Path) -> Tokenizer:
    """The gptlab tokenizer of the transformers model in `directory`, from its tokenizer.json: GPT-2's byte-level
    BPE, or one trained by data.tokenizer=bpe (gptlab's exports of such runs); GPT-2's for a GPT-2-family directory
    without the file. Anything else is an HFError."""
    path = directory / HF_TOKENIZER
    if not path.is_file():
        kind = _read_hf_config(directory).get("model_type")
        if kind in ARCHITECTURE_CLASS:  # gpt2 or gpt_bigcode
            return Gpt2Tokenizer()
        raise HFError(f"{directory} has no {HF_TOKENIZER}, where a {kind!r} model's tokenizer is read from")
    try:
        text = path.read_text(encoding="utf-8")
        tokenizer = json.loads(text)
    except (OSError, ValueError) as err:
        raise HFError(f"cannot read {path}: {err}") from err
    bpe = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    bpe = bpe if isinstance(bpe, dict) else {}
    # tokenizers writes a merge as "a b" or, since 0.20, as ["a", "b"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in bpe.get("merges") or []]
    gpt2 = _gpt2_tokenizer_json()["model"]
    if bpe.get("vocab") == gpt2["vocab"] and merges == gpt2["merges"]:
        return Gpt2Tokenizer()
    try:
        return BpeTokenizer(text)
    except DataError as err:
        raise HFError(
            f"{path} is neither GPT-2's tokenizer nor a byte-level BPE as data.tokenizer=bpe "
            f"trains, the two gptlab reads ({err})"
        ) from err


def save_hf(
    out_dir: str | Path, config: GPTConfig, state: dict[str, Tensor], tokenizer: Tokenizer | None = None
) -> list[str]:
    """Write (config, state) and the tokenizer's files as a transformers model in out_dir (new or empty); returns one
    line per thing written."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise HFError(
            f"{out_dir} is {'not empty' if out_dir.is_dir() else 'a file'}: export into a new or empty directory"
        )
    try:
        hf_config, hf_state = to_hf(config, state, tokenizer.eot_id if tokenizer else None)
    except ValueError as err:
        raise HFError(f"cannot export: {err}") from err
    # Written whole beside out_dir, then renamed onto it (rename replaces an empty directory):
    # out_dir holds a complete export or none, whenever the command is killed.
    temp = temp_path(out_dir.resolve())
    try:
        shutil.rmtree(temp, ignore_errors=True)  # a leftover of a killed export whose process id was ours
        temp.mkdir(parents=True)
        (temp / HF_CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(hf_state, temp / HF_SAFETENSORS, metadata={"format": "pt"})  # transformers expects "format"
        lines = [f"{out_dir}: {hf_config['architectures'][0]} ({HF_CONFIG}, {HF_SAFETENSORS})"]
        if hf_config["architectures"][0] == nanochat.ARCHITECTURE:
            lines.append(nanochat.transformers_line(str(out_dir)))
        name = tokenizer.name if tokenizer else "not recorded in the checkpoint"
        if name == "gpt2":
            lines.append(f"{out_dir}: gpt2 tokenizer ({', '.join(_save_gpt2_tokenizer(temp, config.block_size))})")
        elif name == "bpe":
            written = _save_trained_tokenizer(temp, tokenizer, config.block_size)
            lines.append(f"{out_dir}: the trained bpe tokenizer ({', '.join(written)})")
        else:
            lines.append(
                f"tokenizer ({name}) not exported: only gpt2 and bpe have a transformers equivalent; weights only"
            )
        temp.rename(out_dir.resolve())
    except (OSError, SafetensorError) as err:  # a path under a file, no permission, a full disk
        raise HFError(f"cannot write the export to {out_dir}: {getattr(err, 'strerror', None) or err}") from err
    finally:
        shutil.rmtree(temp, ignore_errors=True)  # gone after the rename; after a failure, the partial export
    return lines


def _save_gpt2_tokenizer(out_dir: Path, model_max_length: int) -> list[str]:
    """GPT-2's own files under transformers' names, <|endoftext|> its bos, eos and unk token, as in OpenAI's gpt2 on
    the Hub, and as one tokenizer.json, which fast-only tokenizer classes (GPTBigCode's) need; returns the names."""
    shutil.copyfile(GPT2_FILES_DIR / "encoder.json", out_dir / "vocab.json")
    shutil.copyfile(GPT2_FILES_DIR / "vocab.bpe", out_dir / "merges.txt")
    special = dict.fromkeys(("bos_token", "eos_token", "unk_token"), EOT_TEXT)
    settings = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length, "add_prefix_space": False}
    (out_dir / "tokenizer_config.json").write_text(json.dumps({**settings, **special}, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    (out_dir / "tokenizer.json").write_text(json.dumps(_gpt2_tokenizer_json(), ensure_ascii=False) + "\n")
    return ["vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def _save_trained_tokenizer(out_dir: Path, tokenizer: Tokenizer, model_max_length: int) -> list[str]:
    """A trained BPE's tokenizer.json as it is, and a tokenizer_config.json for transformers' fast tokenizer
    (<|endoftext|> as its bos and eos token). Returns the names written."""
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    settings |= dict.fromkeys(("bos_token", "eos_token"), EOT_TEXT)
    files = {**tokenizer.files(), "tokenizer_config.json": json.dumps(settings, indent=2) + "\n"}
    for name, content in files.items():
        (out_dir / name).write_text(content, encoding="utf-8")
    return list(files)


def _gpt2_tokenizer_json() -> dict:
    """GPT-2's byte-level BPE in the `tokenizers` library's serialised form."""
    vocab = json.loads((GPT2_FILES_DIR / "encoder.json").read_text(encoding="utf-8"))
    merges = (GPT2_FILES_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:-1]  # "#version" first
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
    eot = {"id": vocab[EOT_TEXT], "content": EOT_TEXT, **flags, "special": True}
    bpe = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": ""}
    bpe |= {"fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}
    head = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [eot], "normalizer": None}
    post = {**byte_level, "trim_offsets": False}
    return {**head, "pre_tokenizer": byte_level, "post_processor": post, "decoder": byte_level, "model": bpe}
