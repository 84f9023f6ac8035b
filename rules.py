"""Declarative rules for settings: a dataclass field states its range or choices once, as `setting(default,
rule)`; `check_rules` enforces it naming the field, and `python -m conf` prints it. Inside `all_problems()`
every section notes its problems and one SettingsError lists them all. Types are not checked here: OmegaConf's
typed merge refuses a wrong type where a config enters, and code that builds a dataclass itself is trusted."""

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

# The problems noted inside all_problems(): each field's rule's, then the cross-field checks'.
_noted: ContextVar[tuple[list[str], list[str]] | None] = ContextVar("noted_problems", default=None)


class SettingsError(ValueError):
    """Every problem found in some settings: one line each, under a header line when there are several."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        header = [f"{len(problems)} settings are wrong:"] if len(problems) > 1 else []
        super().__init__("\n".join(header + [("  " if header else "") + problem for problem in problems]))


@dataclass(frozen=True)
class Rule:
    """An interval (`low`/`high`, ends included as `ends` says), choices, or a pattern a text must match in
    full (`meaning` says it in words). None always passes: a field that may be None says so in its type."""

    low: float = -math.inf
    high: float = math.inf
    ends: str = "[]"
    choices: tuple = ()
    pattern: str = ""
    meaning: str = ""
    words: tuple = ()  # texts allowed besides a whole number in the interval (batch_size's auto)

    def allows(self, value: Any) -> bool:
        if value is None:
            return True
        if isinstance(value, list):
            return all(self.allows(item) for item in value)
        if self.words and (value in self.words or isinstance(value, bool) or not isinstance(value, int)):
            return value in self.words
        if self.choices:
            return value in self.choices
        if self.pattern:
            return re.fullmatch(self.pattern, value) is not None
        above = value > self.low if self.ends[0] == "(" else value >= self.low
        below = value < self.high if self.ends[1] == ")" else value <= self.high
        return math.isfinite(value) and above and below  # an interval's members are numbers a run computes with

    def or_words(self, *words: str) -> "Rule":
        """This interval's whole numbers, or one of `words` (a field typed Any holds either)."""
        return replace(self, words=words)

    def __str__(self) -> str:
        if self.words:
            return f"{' or '.join(self.words)} or a whole number {str(replace(self, words=()))}"
        if self.choices:
            return f"one of {self.choices}"
        if self.pattern:
            return self.meaning
        if self.high == math.inf and self.ends[1] == "]":
            return f"{'>' if self.ends[0] == '(' else '>='} {_number(self.low)}"
        return f"in {self.ends[0]}{_number(self.low)}, {_number(self.high)}{self.ends[1]}"


def at_least(low: float) -> Rule:
    return Rule(low=low)


def above(low: float) -> Rule:
    return Rule(low=low, ends="(]")


def between(low: float, high: float, ends: str = "[]") -> Rule:
    return Rule(low=low, high=high, ends=ends)


def one_of(*choices: Any) -> Rule:
    return Rule(choices=choices)


def matching(pattern: str, meaning: str) -> Rule:
    return Rule(pattern=pattern, meaning=meaning)


NOT_EMPTY = matching(r"(?s).+", "a non-empty text")
SEED = between(0, 2**32 - 1)  # what numpy's seeding takes


def setting(default: Any = MISSING, rule: Rule | None = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its default and its rule (None: any value of its type)."""
    start = {"default": default} if factory is None else {"default_factory": factory}
    return field(**start, metadata={"rule": rule} if rule else {})


def rule_of(f) -> Rule | None:
    return f.metadata.get("rule")


def check_rules(settings: Any, prefix: str = "", conflicts: Callable[[], Iterable[str]] | None = None) -> None:
    """SettingsError naming every field of the dataclass `settings` that breaks its rule or, when each keeps it, every
    problem `conflicts` finds across fields; inside all_problems() they are noted instead, for one error at its end."""
    broken = []
    for f in fields(settings):
        rule, value = rule_of(f), getattr(settings, f.name)
        if rule is not None and not rule.allows(value):
            each = "'s every item" if isinstance(value, list) else ""
            finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
            broken.append(f"{prefix}{f.name}{each} must be {finite}{rule}, got {value!r}")
    crossed = list(conflicts()) if conflicts is not None and not broken else []
    if (noted := _noted.get()) is not None:
        noted[0].extend(broken)
        noted[1].extend(crossed)
    elif broken or crossed:
        raise SettingsError(broken + crossed)


@contextlib.contextmanager
def all_problems() -> Iterator[None]:
    """Settings built inside note their problems and go on; at the end one SettingsError lists them, rules' first."""
    noted: tuple[list[str], list[str]] = ([], [])
    token = _noted.set(noted)
    try:
        yield
    finally:
        _noted.reset(token)
    if problems := list(dict.fromkeys(noted[0] + noted[1])):  # one built from another's fields repeats them
        raise SettingsError(problems)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
