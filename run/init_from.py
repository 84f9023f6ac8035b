"""Where a new run's weights come from: scratch, a gptlab checkpoint, or Hugging Face.

From existing weights the model's shape is theirs; the run may still choose fewer key/value heads (mean-pooled
per group: Ainslie et al., 2023, "uptraining" MHA into GQA/MQA), a shorter context (the position table cropped,
as nanoGPT does), and its own dropout and attention path. A recipe's or preset's value of any other model setting
is replaced by theirs, and one named on the command line (model/block=llama) that contradicts them is refused.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from torch import Tensor

from conf import Config
from conf.cli import named_settings
from data import Tokenizer
from hf.files import HFError, hf_tokenizer, load_hf_pretrained, local_hf_dir, resolve_hf_dir
from hf.gpt2 import crop_block_size, pool_kv_heads
from model import GPTConfig
from run.checkpoints import CheckpointError, find_checkpoint, load_checkpoint
from run.run_dir import command_line_overrides

# The model settings a run from existing weights chooses itself: fewer key/value heads (pooled),
# a shorter context (cropped), dropout, the attention path and document masks; vocab_size is refused by Config.
RUN_CHOICES = ("n_kv_head", "block_size", "dropout", "attn_impl", "document_masks", "vocab_size")


def check_model_path(config: Config) -> None:
    """Refuse a model_path that leads nowhere before any data or model work (a Hub name is read later)."""
    if config.init_from == "checkpoint":
        find_checkpoint(config.model_path, config.runs_root, setting="model_path")
    elif config.init_from == "hf":
        with reading_hf():
            local_hf_dir(config.model_path)


@contextlib.contextmanager
def reading_hf() -> Iterator[None]:
    """A Hugging Face model that cannot be read is a CheckpointError, as any other model, with hf/'s message."""
    try:
        yield
    except HFError as err:
        raise CheckpointError(str(err)) from err


def initial_model(config: Config, tokenizer: Tokenizer) -> tuple[GPTConfig, dict[str, Tensor] | None]:
    """A new run's model config (naming its key/value heads) and the weights to start from (None: random init)."""
    if config.init_from == "scratch":
        return scratch_config(config, tokenizer.vocab_size, tokenizer.eot_id), None
    if config.init_from == "hf":
        if tokenizer.name != "gpt2":
            raise ValueError(f"init_from=hf needs the gpt2 tokenizer, but data.tokenizer is {tokenizer.name}")
        with reading_hf():
            directory = resolve_hf_dir(config.model_path)
            theirs = hf_tokenizer(directory)  # before the weights: a refusal reads no gigabytes
            if theirs.describe() != tokenizer.describe():
                raise HFError(
                    f"{directory}'s tokenizer.json is not GPT-2's ({theirs.name}, {theirs.vocab_size} ids), "
                    "and init_from=hf trains on GPT-2's tokens: its model would read other ids than "
                    "it learned; start from a model trained with GPT-2's tokenizer"
                )
            source, state = load_hf_pretrained(directory, n_kv_head=config.model.n_kv_head)
        refuse_contradictions(config.model, source, f"the weights of {config.model_path}")
    else:
        checkpoint = load_checkpoint(find_checkpoint(config.model_path, config.runs_root, setting="model_path"))
        if checkpoint.config.get("tokenizer") != tokenizer.describe():
            raise ValueError(
                f"init_from=checkpoint: {checkpoint.path} was trained with another tokenizer "
                f"({checkpoint.config.get('tokenizer', {}).get('name')}); use the same data settings"
            )
        source, state = checkpoint.model_config, checkpoint.model_state
        refuse_contradictions(config.model, source, f"the checkpoint {checkpoint.path}")
        if (kv_heads := config.model.n_kv_head) is not None and kv_heads != source.kv_heads:  # None: the weights'
            try:
                source, state = pool_kv_heads(state, source, kv_heads)
            except ValueError as err:
                raise CheckpointError(f"cannot convert {checkpoint.path}: {err}") from err
    if tokenizer.vocab_size > source.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the weights only {source.vocab_size}")
    if (block_size := config.model.block_size) > source.block_size:
        raise ValueError(
            f"model.block_size ({block_size}) is longer than the context of {config.model_path} ({source.block_size}): "
            f"{'learned positions cannot be extended' if source.position == 'learned' else 'it was trained no longer'}"
            f"; set model.block_size={source.block_size} or less"
        )
    if block_size < source.block_size:
        source, state = crop_block_size(state, source, block_size)
    documents = {"document_masks": config.model.document_masks, "eot_id": document_opener(config, tokenizer.eot_id)}
    return replace(source, dropout=config.model.dropout, attn_impl=config.model.attn_impl, **documents), state


def refuse_contradictions(asked: GPTConfig, weights: GPTConfig, source: str) -> None:
    """One error naming each model setting of the command line (model.x=, model/block=...) that `weights` contradict."""
    by_override: dict[str, list[str]] = {}
    for key, override in named_settings(command_line_overrides(), "model").items():
        if key not in RUN_CHOICES and (mine := getattr(asked, key)) != (theirs := getattr(weights, key)):
            by_override.setdefault(override, []).append(f"model.{key}={mine!r} (there {theirs!r})")
    if by_override:
        clashes = "; ".join(f"{override} contradicts {source}: {', '.join(s)}" for override, s in by_override.items())
        raise ValueError(
            f"{clashes}; a run from existing weights has their model: leave "
            f"{'this' if len(by_override) == 1 else 'these'} unset, or start from scratch"
        )


def scratch_config(config: Config, vocab_size: int, eot_id: int | None) -> GPTConfig:
    """A new model's config for a tokenizer of `vocab_size` ids (padded to pad_vocab_to), <|endoftext|> eot_id."""
    return replace(
        config.model,
        vocab_size=-(-vocab_size // config.pad_vocab_to) * config.pad_vocab_to,  # rounded up
        n_kv_head=config.model.kv_heads,
        eot_id=document_opener(config, eot_id),
    )


def document_opener(config: Config, eot_id: int | None) -> int | None:
    """model.eot_id: the tokenizer's <|endoftext|> with document_masks, None without them."""
    if not config.model.document_masks:
        return None
    if eot_id is None:
        raise ValueError(
            "model.document_masks=true needs documents, and this corpus has one: its character "
            "tokenizer has no <|endoftext|> (give data.document_separator, or leave document_masks false)"
        )
    return eot_id
