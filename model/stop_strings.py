"""Stop strings for the engine: text that ends a sample, however the tokens split it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .engine import StopCheck


def stop_string_check(decode: Callable[[list[int]], str], stops: Sequence[str]) -> StopCheck | None:
    """Ends a sample once its text (`decode` of its tokens) contains a stop string. One the newest token completes
    lies within the last `window` tokens (each at least a byte): decoding only those keeps the check linear."""
    if not stops:
        return None
    window = max(len(stop.encode("utf-8")) for stop in stops)
    return lambda generated: cut_at_stop(decode(generated[-window:]), stops)[1]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """text up to the first stop string in it, and whether there was one."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)
