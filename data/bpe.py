"""A byte-level BPE trained on the corpus (data.tokenizer=bpe) by `tokenizers`, and `load_tokenizer`,
which knows all three tokenizers (this module sits above data/tokenizer.py).

Ids: the 256 bytes (in GPT-2's byte alphabet order), one per merge as learned, <|endoftext|> last. Text is split about
as GPT-2 splits it, so no token spans two words. The tokenizer is tokenizers' JSON (tokenizer.json: data, never code)
beside meta.json and in every checkpoint, named with its sha256 by `describe()`: a damaged or swapped file is refused.
"""

import functools
import hashlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HfTokenizer

from data.config import BPE_MIN_PAIR_COUNT, BPE_SAMPLE_BYTES, MIN_BPE_VOCAB
from data.errors import DataError, reading
from data.meta import META_FILE, read_meta
from data.tokenizer import EOT_TEXT, CharTokenizer, Gpt2Tokenizer, Tokenizer, gpt2_byte_alphabet

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
# The tokenizer learns from the corpus's first 64 MiB of text: its merges are the sample's most
# frequent pairs, and three times the sample compresses held-out text only 0.1-0.25% better at
# 8192-32768 ids (docs/data.md). Training time and memory grow with the sample, not the corpus.
TRAINING_SAMPLE_BYTES = BPE_SAMPLE_BYTES
MIN_PAIR_COUNT = BPE_MIN_PAIR_COUNT  # a pair seen once in the sample is noise, never a merge
# GPT-2's pre-tokenisation, except that a run of whitespace stays whole where GPT-2 gives its
# last space to the next word: Python's newline and indentation are one piece. Held-out
# standard library text then takes 0.3-1.5% fewer tokens at 512-16384 ids (docs/data.md).
SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"""


class BpeTokenizer(Tokenizer):
    name = "bpe"

    def __init__(self, tokenizer_json: str):
        """`tokenizer_json`: a byte-level BPE in tokenizers' JSON form, as train_bpe() makes it."""
        self.json = tokenizer_json
        self._tokenizer = HfTokenizer.from_str(tokenizer_json)
        self._tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" is text (see Tokenizer.encode)
        self.vocab_size, self.eot_id = self._tokenizer.get_vocab_size(), self._tokenizer.token_to_id(EOT_TEXT)
        byte_of_char = gpt2_byte_alphabet()
        pieces = [self._tokenizer.id_to_token(i) for i in range(self.vocab_size)]
        if self.eot_id is None or any(
            p is None or (i != self.eot_id and set(p) - byte_of_char.keys()) for i, p in enumerate(pieces)
        ):
            raise DataError(f"not a byte-level BPE with {EOT_TEXT}, as data.tokenizer=bpe trains: train it again")
        # the bytes each id stands for (<|endoftext|>'s own text for it)
        self._bytes = [
            EOT_TEXT.encode() if i == self.eot_id else bytes(byte_of_char[c] for c in p) for i, p in enumerate(pieces)
        ]

    def encode_array(self, text: str) -> np.ndarray:
        try:  # the batch call lets go of the GIL: prepare's threads encode in parallel
            return np.asarray(self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids, np.uint32)
        except TypeError:  # lone surrogates have no UTF-8: U+FFFD for each, as tiktoken does
            return self.encode_array(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return b"".join(self._bytes[i] for i in ids)

    def describe(self) -> dict:
        digest = hashlib.sha256(self.json.encode("utf-8")).hexdigest()
        return {"name": self.name, "vocab_size": self.vocab_size, "file": TOKENIZER_FILE, "sha256": digest}

    def files(self) -> dict[str, str]:
        return {TOKENIZER_FILE: self.json}

    def token_bytes(self) -> list[int]:
        return [0 if i == self.eot_id else len(piece) for i, piece in enumerate(self._bytes)]


def train_bpe(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """A byte-level BPE of at most vocab_size ids learned from `texts` (fewer when they run out of pairs
    seen MIN_PAIR_COUNT times). Deterministic: merges are picked by count, ties by pair, whatever the threads."""
    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"vocab_size must be at least {MIN_BPE_VOCAB} (256 bytes and {EOT_TEXT}), got {vocab_size}")
    tokenizer = HfTokenizer(models.BPE())
    split = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    as_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # bytes -> GPT-2's byte characters
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, as_bytes])
    tokenizer.decoder = decoders.ByteLevel()  # for transformers' decode; BpeTokenizer decodes by its own table
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, min_frequency=MIN_PAIR_COUNT, show_progress=False, initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens([EOT_TEXT])  # after training: the last id, as in GPT-2
    return BpeTokenizer(tokenizer.to_str())


def train_on_sample(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """train_bpe on the first TRAINING_SAMPLE_BYTES of `texts`, warning when it learns fewer ids than asked."""
    tokenizer = train_bpe(_leading_bytes(texts, TRAINING_SAMPLE_BYTES), vocab_size)
    if tokenizer.vocab_size < vocab_size:
        log.warning(
            f"the tokenizer's training stopped at {tokenizer.vocab_size} ids, short of data.vocab_size={vocab_size}: "
            f"a small training text runs out of pairs seen {MIN_PAIR_COUNT} times or more"
        )
    return tokenizer


def _leading_bytes(texts: Iterable[str], limit: int) -> Iterator[str]:
    """The texts up to and including the one that brings their UTF-8 total to `limit` bytes."""
    total = 0
    for text in texts:
        if total >= limit:
            return
        total += len(text.encode("utf-8"))
        yield text


@functools.lru_cache(maxsize=4)
def _bpe_from_json(tokenizer_json: str) -> BpeTokenizer:
    try:
        return BpeTokenizer(tokenizer_json)
    except DataError:
        raise
    except Exception as err:  # tokenizers raises its own exception for JSON it cannot read
        raise DataError(f"{TOKENIZER_FILE} is not a tokenizers JSON file ({err}): prepare the data again") from err


def load_tokenizer(source: dict | str | Path, directory: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a data directory, its meta.json (path or parsed), or a describe() with files in `directory`."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        directory = path.parent if path.name == META_FILE else path
        source = read_meta(directory)
    description = source.get("tokenizer", source)
    if description.get("name") == "gpt2":
        return Gpt2Tokenizer()
    if description.get("name") == "char" and isinstance(description.get("chars"), str):
        return CharTokenizer(description["chars"], with_eot=bool(description.get("eot")))
    if description.get("name") != "bpe":
        raise DataError(
            f"unknown tokenizer description {description!r}; known: gpt2, char (with 'chars', 'eot'), "
            "bpe (with 'file', 'sha256')"
        )
    if description.get("file") != TOKENIZER_FILE or not isinstance(description.get("sha256"), str):
        raise DataError(f"a bpe tokenizer's description names its {TOKENIZER_FILE} and sha256; got {description!r}")
    if directory is None:
        raise DataError(
            f"the bpe tokenizer is in a {TOKENIZER_FILE} file: load it from the data or checkpoint "
            "directory that holds it"
        )
    path = Path(directory) / TOKENIZER_FILE
    with reading(path, role=", the trained tokenizer its directory was made with"):
        content = path.read_bytes()
    if hashlib.sha256(content).hexdigest() != description["sha256"]:
        raise DataError(
            f"{path} does not match the sha256 recorded with it (it was edited, damaged or replaced): "
            "use a copy of the directory it came from, or prepare the data again"
        )
    return _bpe_from_json(content.decode("utf-8"))
