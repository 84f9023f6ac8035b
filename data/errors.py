"""The one exception data/ raises for problems with the user's data or files."""

from system import UserError


class DataError(UserError, RuntimeError):
    """Something is wrong with a corpus, a shard or meta.json; the message says what and how to fix it."""


def describe_error(err: BaseException) -> str:
    """An exception and, when it wraps others (`raise ... from ...`), the innermost one: the real
    cause (datasets wraps, say, Arrow's capacity error in a DatasetGenerationError)."""
    cause, seen = err, {id(err)}
    while cause.__cause__ is not None and id(cause.__cause__) not in seen:
        cause = cause.__cause__
        seen.add(id(cause))
    text = f"{type(err).__name__}: {err}"
    return text if cause is err else f"{text}; caused by {type(cause).__name__}: {cause}"
