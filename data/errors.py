"""The one exception data/ raises for problems with the user's data or files."""


class DataError(RuntimeError):
    """Something is wrong with a corpus, a shard or meta.json; the message says what and how to fix it."""
