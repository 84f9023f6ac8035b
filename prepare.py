"""Run the prepare step on its own: Hydra composes the overrides into train.py's own config
(conf/train.yaml), so presets, experiments, quoting and typing mean the same; only `data` is used.

    python prepare.py                                       # the default corpus: stdlib, gpt2
    python prepare.py data=shakespeare_char data.path=input.txt
    python prepare.py "data.path='/my notes/book.txt'"      # Hydra's quoting, as for train.py
"""

import argparse
import logging

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below, as in train.py
    quiet_interrupt_while_starting()

from hydra import compose, initialize_config_dir

from conf import CONF_DIR, Config, load_config, one_line_errors
from conf.cli import check_overrides
from data.config import DataConfig
from data.preparation import prepare
from system import exits


def config_from_overrides(overrides: list[str]) -> DataConfig:
    """The DataConfig train.py would run with these overrides; ValueError (one line) when they do not compose."""
    with one_line_errors(), initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load_config(compose(config_name="train", overrides=overrides)).data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python prepare.py",
        description="Tokenise a corpus into train.bin / val.bin / meta.json (skipped when already done).",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data=<preset> and data.<field>=<value>")
    args = parser.parse_args(argv)
    check_overrides(args.overrides, Config, "train")  # train.py's one-line message for a bad override
    with exits(writing="the data directory"):  # one line, as train.py prints it
        cfg = config_from_overrides(args.overrides)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        prepared = prepare(cfg)
    meta = prepared.meta
    print(
        f"{'reused' if prepared.reused else 'wrote'} {prepared.data_dir}: train {meta['tokens']['train']:,} "
        f"and val {meta['tokens']['val']:,} {meta['dtype']} tokens, tokenizer {meta['tokenizer']['name']} "
        f"(vocab {meta['vocab_size']}), from {meta['source']}"
    )


if __name__ == "__main__":
    main()
