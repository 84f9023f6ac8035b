"""The one exception data/ raises for problems with the user's data or files."""

import contextlib
from collections.abc import Iterator

from system import UserError


class DataError(UserError, RuntimeError):
    """Something is wrong with a corpus, a shard or meta.json; the message says what and how to fix it."""


def describe_error(err: BaseException) -> str:
    """The exception and its innermost cause (`raise ... from ...`): datasets wraps, say, Arrow's errors in its own."""
    cause, seen = err, {id(err)}
    while cause.__cause__ is not None and id(cause.__cause__) not in seen:
        cause = cause.__cause__
        seen.add(id(cause))
    text = f"{type(err).__name__}: {err}"
    return text if cause is err else f"{text}; caused by {type(cause).__name__}: {cause}"


@contextlib.contextmanager
def reading(path, kind: str = "", role: str = "") -> Iterator[None]:
    """An OSError inside, reading `path` (a `kind` of file, with a `role`), as the DataError naming it."""
    try:
        yield
    except OSError as err:
        raise DataError(f"cannot read {kind}{path}{role}: {err.strerror}") from err


@contextlib.contextmanager
def failing_as(what: str, hint: str = "") -> Iterator[None]:
    """Any error inside but a DataError (datasets raises many types) as DataError("<what> (<error; cause>)<hint>")."""
    try:
        yield
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001
        raise DataError(f"{what} ({describe_error(err)}){hint}") from err
