"""Declarative rules for settings. A dataclass field states its range or its choices once,
as `setting(default, rule)`; `check_rules` enforces every field's rule and names the field,
and the configuration reference (`python -m conf`) prints the same rule. Types are not
checked here: OmegaConf's typed merge refuses a value of the wrong type where a config
enters, and code that builds a dataclass itself is trusted."""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """An interval (`low`/`high`, ends included as `ends` says), a set of choices, or a
    pattern a text must match in full (`meaning` says it in words). None always passes:
    a field that may be None says so in its type."""

    low: float = -math.inf
    high: float = math.inf
    ends: str = "[]"
    choices: tuple = ()
    pattern: str = ""
    meaning: str = ""

    def allows(self, value: Any) -> bool:
        if value is None:
            return True
        if isinstance(value, list):
            return all(self.allows(item) for item in value)
        if self.choices:
            return value in self.choices
        if self.pattern:
            return re.fullmatch(self.pattern, value) is not None
        above = value > self.low if self.ends[0] == "(" else value >= self.low
        below = value < self.high if self.ends[1] == ")" else value <= self.high
        return above and below

    def __str__(self) -> str:
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
    metadata = {"rule": rule} if rule else {}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def rule_of(f) -> Rule | None:
    return f.metadata.get("rule")


def check_rules(settings: Any, prefix: str = "") -> None:
    """ValueError naming the first field of the dataclass `settings` that breaks its rule."""
    for f in fields(settings):
        rule, value = rule_of(f), getattr(settings, f.name)
        if rule is not None and not rule.allows(value):
            each = "'s every item" if isinstance(value, list) else ""
            raise ValueError(f"{prefix}{f.name}{each} must be {rule}, got {value!r}")


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
