"""Hub corpora through `datasets`: a Hub dataset id (downloaded first, or streamed), or a
local dataset directory (a `save_to_disk` one, memory-mapped; else its data files, streamed).
Imported only for data.source=hub: datasets takes half a second to import.
"""

import contextlib
from pathlib import Path

import datasets

from data.config import DataConfig
from data.errors import DataError, failing_as
from data.readers import ROWS_PER_BATCH, Corpus, Rows, Stream, check_column


def hub_corpus(cfg: DataConfig, piece_chars: int) -> Corpus:
    local, origin = Path(cfg.dataset).expanduser(), f"data.dataset={cfg.dataset!r}"
    saved = (local / "state.json").is_file() or (local / "dataset_dict.json").is_file()  # by save_to_disk
    # A local directory, or only the first documents, are read as a stream: no copy, no full download.
    streamed = not saved and (cfg.streaming or local.is_dir() or cfg.max_documents is not None)
    what = "saved dataset" if saved else cfg.subset or "default"
    mode = "" if saved else ", streaming" if streamed else ", map-style"
    description = f"{cfg.dataset} ({what}, split {cfg.split}{mode})"
    if streamed:
        opened = [_open_stream(cfg)]  # fails here, before any work, if the source cannot be read

        def open_stream():  # the stream checked above serves the first read; later reads open anew
            return opened.pop() if opened else _open_stream(cfg)

        return Corpus(Stream(open_stream, cfg.text_column, origin, piece_chars), description)
    table = _text_column(_load_saved(local, cfg) if saved else _load_hub(cfg, streaming=False), cfg.text_column)
    return Corpus(Rows(_table_batches(table), cfg.text_column, origin, piece_chars), description)


def _open_stream(cfg: DataConfig):
    stream = _load_hub(cfg, streaming=True)
    with failing_as(f"could not read data.dataset={cfg.dataset!r} through datasets"):
        return _text_column(stream, cfg.text_column)  # reads the first row, for the columns


def _load_saved(path: Path, cfg: DataConfig) -> datasets.Dataset:
    with failing_as(f"could not load the saved dataset {path}"):
        saved = datasets.load_from_disk(str(path))
    if not isinstance(saved, datasets.DatasetDict):
        return saved
    if cfg.split not in saved:
        raise DataError(f"the saved dataset {path} has no split {cfg.split!r} (it has {sorted(saved)}); set data.split")
    return saved[cfg.split]


def _load_hub(cfg: DataConfig, streaming: bool):
    """datasets.load_dataset, with its failures (offline, missing, malformed) explained.
    A local directory loads without datasets' progress bars: they would say "Downloading data"."""
    options = dict(name=cfg.subset, split=cfg.split, revision=cfg.revision, streaming=streaming)
    if not streaming:
        options["num_proc"] = cfg.resolved_num_proc()
    hint = ""
    if local := Path(cfg.dataset).expanduser().is_dir():  # for a Hub id: the Hub-only settings a preset may carry
        subset = f"data.subset={cfg.subset!r} names a configuration the directory may lack (set data.subset=null)"
        hints = ([subset] if cfg.subset else []) + [f"data.split={cfg.split!r} must be a split the directory has"]
        hint = "; a local directory replaces the Hub id here: " + ", and ".join(hints)
    with failing_as(f"could not load data.dataset={cfg.dataset!r} through datasets", hint), _quiet(local):
        return datasets.load_dataset(cfg.dataset, cache_dir=str(cfg.resolved_hf_cache_dir()), **options)


@contextlib.contextmanager
def _quiet(local: bool):
    """No usage ping (datasets counts a packaged builder's use online: up to 3 s offline); local: no progress bars."""
    saved, was_disabled = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS, datasets.are_progress_bars_disabled()
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    if local:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved
        if local and not was_disabled:
            datasets.enable_progress_bars()


def _table_batches(table: datasets.Dataset):
    return lambda first: (table[i : i + ROWS_PER_BATCH]["text"] for i in range(first, len(table), ROWS_PER_BATCH))


def _text_column(documents, column: str):
    columns = documents.column_names or list(next(iter(documents), {}))  # streams may not know theirs
    check_column(column, columns)
    documents = documents.select_columns([column])
    return documents if column == "text" else documents.rename_column(column, "text")
