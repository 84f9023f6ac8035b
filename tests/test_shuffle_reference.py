"""The prepare step's shards against an independent reference of the block-shuffle
format docs/data.md describes (step 5), byte for byte, over more than 5 blocks.

The format: the documents' tokens in reading order are cut into blocks of
shuffle_block_tokens; in block k the runs of tokens (a document, or its part in the
block) are permuted by numpy's default_rng([split_seed, k]), except a run continuing the
previous block (it stays first) and the run at a full block's end (it may go on in the
next, so it stays last); the end-of-text token goes before each document but the first
one written; the block's first int(n x (1 - val_fraction)) tokens go to train.bin and
the rest to val.bin. Written here from that description, not from data/shards.py.
"""

import itertools
import json
import random

import numpy as np
import pytest

from data import DataConfig, prepare

BLOCK = 300  # tokens per shuffle block: the corpus below makes 7 of them
VAL_FRACTION = 0.1


def reference_shards(documents: list[list[int]], eot: int, seed: int) -> tuple[list[int], list[int], int]:
    """(train tokens, val tokens, blocks) of the documented format."""
    stream = [(d, i == 0, token) for d, tokens in enumerate(documents) for i, token in enumerate(tokens)]
    train, val, blocks = [], [], 0
    for k, start in enumerate(range(0, len(stream), BLOCK)):
        block = stream[start : start + BLOCK]
        runs = []  # [document, whether the run opens it, its tokens]
        for document, opens, token in block:
            if runs and runs[-1][0] == document:
                runs[-1][2].append(token)
            else:
                runs.append([document, opens, [token]])
        first = 0 if runs[0][1] else 1
        last = max(first, len(runs) - 1 if len(block) == BLOCK else len(runs))
        middle = runs[first:last]
        order = np.random.default_rng([seed, k]).permutation(len(middle))
        written = []
        for index, (_, opens, tokens) in enumerate(runs[:first] + [middle[i] for i in order] + runs[last:]):
            if opens and not (k == 0 and index == 0):
                written.append(eot)
            written += tokens
        n_train = int(len(written) * (1 - VAL_FRACTION))
        train, val, blocks = train + written[:n_train], val + written[n_train:], blocks + 1
    return train, val, blocks


def documents_text(count: int) -> list[str]:
    """Documents of 5 to 95 characters in no pattern (a character is a token), one of them
    cut to end exactly where block 1 does: block 2 opens with a document, separator first."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    texts = []
    for _ in range(count):
        text, length = "", rng.randint(5, 95)
        while len(text) < length:
            text += rng.choice(words) + rng.choice(" .,\n")
        texts.append(text)
    ends = list(itertools.accumulate(map(len, texts)))
    cut = next(i for i, end in enumerate(ends) if end >= 2 * BLOCK)
    texts[cut] = texts[cut][: len(texts[cut]) - (ends[cut] - 2 * BLOCK)]
    return texts


@pytest.mark.parametrize("seed", [1337, 5])
def test_the_shards_are_the_documented_block_shuffle_byte_for_byte(tmp_path, seed):
    texts = documents_text(40)
    source = tmp_path / "documents.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    prepared = prepare(
        DataConfig(
            name="t",
            source="files",
            path=str(source),
            tokenizer="char",
            data_dir=str(tmp_path / "data"),
            num_proc=1,
            split_seed=seed,
            shuffle_block_tokens=BLOCK,
            val_fraction=VAL_FRACTION,
        )
    )
    tokenizer = prepared.tokenizer()
    documents = [tokenizer.encode(text) for text in texts]
    assert sum(map(len, documents)) % BLOCK  # the last block is short: it keeps no run in place at its end
    train, val, blocks = reference_shards(documents, tokenizer.eot_id, seed)
    assert blocks == prepared.meta["blocks"] > 5
    dtype = np.dtype(prepared.meta["dtype"])
    assert prepared.shard("train").read_bytes() == np.array(train, dtype=dtype).tobytes()
    assert prepared.shard("val").read_bytes() == np.array(val, dtype=dtype).tobytes()
