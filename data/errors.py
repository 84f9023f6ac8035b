"""The one exception data/ raises for problems with the user's data or files."""

from system import UserError


class DataError(UserError, RuntimeError):
    """Something is wrong with a corpus, a shard or meta.json; the message says what and how to fix it."""


def innermost_cause(err: BaseException) -> BaseException:
    """The exception at the bottom of a chain of `raise ... from ...`: what really went wrong
    (datasets wraps, say, Arrow's capacity error in a DatasetGenerationError)."""
    seen = {id(err)}
    while err.__cause__ is not None and id(err.__cause__) not in seen:
        err = err.__cause__
        seen.add(id(err))
    return err


def describe_error(err: BaseException) -> str:
    """An exception and, when it wraps another, the innermost one: the real cause."""
    cause = innermost_cause(err)
    text = f"{type(err).__name__}: {err}"
    return text if cause is err else f"{text}; caused by {type(cause).__name__}: {cause}"
