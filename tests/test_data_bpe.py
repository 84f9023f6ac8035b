"""The tokenizer trained on the corpus (data.tokenizer=bpe): byte-level round trips, ids
that follow its own merges (checked by a plain-Python BPE), determinism, its file beside
meta.json, and the fingerprint of the data it makes."""

import json
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

import data.bpe
import data.cache
import data.preparation
from conftest import CORPUS
from data import DataConfig, DataError, load_tokenizer, prepare
from data.bpe import SPLIT_PATTERN, TOKENIZER_FILE, BpeTokenizer, train_bpe
from data.cache import fingerprint_of

EOT = "<|endoftext|>"
PYTHON = Path(data.preparation.__file__).read_text(encoding="utf-8")  # some 17 KB of Python
TEXTS = [CORPUS, PYTHON]
VOCAB = 400


@pytest.fixture(scope="module")
def tokenizer() -> BpeTokenizer:
    return train_bpe(TEXTS, VOCAB)


def gpt2_byte_characters() -> dict[int, str]:
    """GPT-2's bytes_to_unicode, as OpenAI's encoder.py writes it: printable bytes as themselves."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}


def reference_encode(tokenizer_json: str, text: str) -> list[int]:
    """Plain BPE: split by the pattern, then merge the lowest-ranked adjacent pair until none is left."""
    model = json.loads(tokenizer_json)["model"]
    rank = {tuple(merge): i for i, merge in enumerate(model["merges"])}
    spell = gpt2_byte_characters()
    ids = []
    for word in regex.findall(SPLIT_PATTERN, text):
        parts = [spell[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), len(rank)))
            if (parts[best], parts[best + 1]) not in rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        ids += [model["vocab"][part] for part in parts]
    return ids


def test_ids_follow_the_learned_merges_with_bytes_first_and_eot_last(tokenizer):
    assert tokenizer.vocab_size == VOCAB and tokenizer.eot_id == VOCAB - 1
    assert sorted(tokenizer.decode_bytes([i]) for i in range(256)) == [bytes([b]) for b in range(256)]
    for text in [*TEXTS, "naïve café 🤖\n\n\tdef f(x):\n        return x  # ok"]:
        assert tokenizer.encode(text) == reference_encode(tokenizer.json, text)
    python_ids = tokenizer.encode(PYTHON)
    assert len(PYTHON.encode()) / len(python_ids) > 1.5  # 143 merges learned from its training text


PIECES = st.sampled_from([EOT, "<|endoftext", "|>", "    ", "\n", "\t", "def ", "é", "🤖", "\ufffd", "\x00", "'s"])


@settings(max_examples=60, deadline=None)
@given(text=st.lists(PIECES | st.text(), max_size=8).map("".join))
@example(text=f"a{EOT}b\n    {EOT}")
def test_any_text_round_trips_and_a_literal_eot_stays_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and tokenizer.decode_bytes(ids) == text.encode("utf-8")
    assert tokenizer.eot_id not in ids
    sizes = tokenizer.token_bytes()
    assert sum(sizes[i] for i in ids) == len(text.encode("utf-8"))  # what bits per byte divide by


def test_token_bytes_and_decode_bytes_per_id(tokenizer):
    sizes = tokenizer.token_bytes()
    assert len(sizes) == tokenizer.vocab_size and sizes[tokenizer.eot_id] == 0
    vocab = json.loads(tokenizer.json)["model"]["vocab"]
    spell = {c: b for b, c in gpt2_byte_characters().items()}
    for token, i in vocab.items():
        assert tokenizer.decode_bytes([i]) == bytes(spell[c] for c in token) and sizes[i] == len(token)
    assert tokenizer.decode([tokenizer.eot_id]) == EOT


def test_training_twice_gives_the_same_tokenizer(tokenizer):
    assert train_bpe(TEXTS, VOCAB).json == tokenizer.json
    assert train_bpe(TEXTS, VOCAB + 64).encode(PYTHON) != tokenizer.encode(PYTHON)


def test_the_description_names_the_file_which_rebuilds_the_same_ids(tokenizer, tmp_path):
    description = tokenizer.describe()
    assert description["file"] == TOKENIZER_FILE and description["vocab_size"] == VOCAB
    for name, content in tokenizer.files().items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    assert load_tokenizer(description, tmp_path).encode(PYTHON) == tokenizer.encode(PYTHON)
    with pytest.raises(DataError, match="load it from the data or checkpoint directory"):
        load_tokenizer(description)
    vocab = json.loads(tokenizer.json)["model"]["vocab"]  # a learned piece (the training text is gptlab's own)
    learned = min((piece for piece, i in vocab.items() if i >= 256 and piece.isalpha()), key=vocab.get)
    edited = tokenizer.json.replace(f'"{learned}"', f'"{learned}q"')
    assert edited != tokenizer.json
    (tmp_path / TOKENIZER_FILE).write_text(edited, encoding="utf-8")
    with pytest.raises(DataError, match="does not match the sha256"):
        load_tokenizer(description, tmp_path)
    (tmp_path / TOKENIZER_FILE).unlink()
    with pytest.raises(DataError, match=f"cannot read {tmp_path / TOKENIZER_FILE}"):
        load_tokenizer(description, tmp_path)


def bpe_config(tmp_path, **overrides) -> DataConfig:
    corpus = tmp_path / "corpus"
    if not corpus.exists():  # written once: the files' times are part of the fingerprint
        corpus.mkdir()
        for i, text in enumerate(TEXTS):
            (corpus / f"doc{i}.txt").write_text(text, encoding="utf-8")
    settings = dict(
        name="t",
        source="files",
        path=str(corpus),
        data_dir=str(tmp_path / "data"),
        num_proc=2,
        tokenizer="bpe",
        vocab_size=VOCAB,
    )
    return DataConfig(**{**settings, **overrides})


def test_prepare_trains_it_keeps_it_beside_meta_json_and_its_size_changes_the_fingerprint(tokenizer, tmp_path):
    cfg = bpe_config(tmp_path)
    prepared = prepare(cfg)
    assert prepared.meta["tokenizer"] == tokenizer.describe()  # trained on the documents, in order
    assert (prepared.data_dir / TOKENIZER_FILE).read_text(encoding="utf-8") == tokenizer.json
    stream = np.concatenate([np.fromfile(prepared.shard(split), dtype=np.uint16) for split in ("train", "val")])
    assert sorted(tokenizer.decode(stream.tolist()).split(EOT)) == sorted(TEXTS)
    assert prepare(cfg).reused
    assert fingerprint_of(bpe_config(tmp_path, vocab_size=VOCAB + 1)) != fingerprint_of(cfg)
    (prepared.data_dir / TOKENIZER_FILE).unlink()  # shards without their tokenizer are rebuilt
    again = prepare(cfg)
    assert not again.reused and again.meta["fingerprint"] == prepared.meta["fingerprint"]
    assert again.tokenizer().encode(PYTHON) == tokenizer.encode(PYTHON)
    with pytest.raises(DataError, match=r'data.tokenizer="char" \(it holds "bpe"\), data.vocab_size=null'):
        prepare(bpe_config(tmp_path, tokenizer="char", vocab_size=None))  # never over the bpe's shards
    char = prepare(bpe_config(tmp_path, tokenizer="char", vocab_size=None, data_dir=str(tmp_path / "char")))
    assert not (char.data_dir / TOKENIZER_FILE).exists()


def test_the_training_sample_is_counted_in_utf8_bytes(tokenizer, monkeypatch):
    """Each text of 10 'é' is 20 bytes: a 30-byte sample is two of them (counted in characters, three)."""
    learned_from = []

    def recording_train_bpe(texts, vocab_size):
        learned_from.extend(texts)
        return BpeTokenizer(tokenizer.json)

    monkeypatch.setattr(data.bpe, "train_bpe", recording_train_bpe)
    monkeypatch.setattr(data.bpe, "TRAINING_SAMPLE_BYTES", 30)
    data.bpe.train_on_sample(iter(["é" * 10] * 5), vocab_size=1)
    assert learned_from == ["é" * 10] * 2


def test_the_sample_size_is_in_a_bpe_corpus_fingerprint_and_not_in_a_char_ones(tmp_path, monkeypatch):
    bpe, char = bpe_config(tmp_path), bpe_config(tmp_path, tokenizer="char", vocab_size=None)
    before = fingerprint_of(bpe), fingerprint_of(char)
    monkeypatch.setattr(data.cache, "TRAINING_SAMPLE_BYTES", 32 << 20)
    assert fingerprint_of(bpe) != before[0] and fingerprint_of(char) == before[1]
