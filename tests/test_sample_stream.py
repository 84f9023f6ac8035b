"""What sample.py prints as a sample streams: the live text holds back an unfinished
character and what may still become a stop string, and the stop check over a window of
tokens ends a sample where a check of the whole text would, across multi-byte characters."""

import io
import random

import pytest

import sample
from data import Gpt2Tokenizer, Tokenizer
from model import cut_at_stop, stop_string_check


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


MULTIBYTE_STOPS = ["\n\n", "caf\u00e9", "\u65e5\u672c", "\U0001f600", "END"]


def multibyte_tokens(text_end: str) -> tuple[Tokenizer, list[int]]:
    """GPT-2 tokens of a text whose characters are split across tokens (byte-level BPE)."""
    tokenizer = Gpt2Tokenizer()
    words = ["na\u00efve", "caf", "\u00e9", "\u65e5\u672c\u8a9e", "\U0001f600", "\u2014", "\n", "E", "ND", "plain"]
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
        return text[: min(found)]
    text = text.rstrip(UNFINISHED)
    held = max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
    return text[: len(text) - held]


def test_live_text_prints_what_the_whole_decoded_text_allows_token_by_token():
    tokenizer, ids = multibyte_tokens("")
    stops = ["END", "\n\n", "\u65e5\u672c\u8a9e\U0001f600\U0001f600"]  # the text has the first only, at 519
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


@pytest.mark.parametrize("stop", ["END", "caf\u00e9", "\U0001f600"])
def test_the_stop_check_finds_a_stop_spelt_one_byte_per_token(stop):
    tokenizer = Gpt2Tokenizer()
    byte_token = {tokenizer.decode_bytes([i]): i for i in range(256 * 4)}  # GPT-2's first ids: the 256 bytes
    ids = [byte_token[bytes([b])] for b in ("so " + stop).encode("utf-8")]
    check = stop_string_check(tokenizer.decode, [stop])
    assert [check(ids[:i]) for i in range(1, len(ids) + 1)] == [False] * (len(ids) - 1) + [True]
