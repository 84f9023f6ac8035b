"""lm-eval's command line with the `gptlab` model registered (lm-eval's own knows only its models):

    python -m evaluation --model gptlab --model_args checkpoint=runs/<run> --device cuda --tasks hellaswag

Every option is lm-eval's. --include_path (a directory whose task files all load) and --limit
(above 0) are checked first, where the harness would fail later, naming something else.
"""

import argparse
import sys

from evaluation import NO_HARNESS

try:
    from lm_eval.__main__ import cli_evaluate
except ImportError:  # the `eval` extra is not installed: one line, as downstream.py says it
    sys.exit(f"error: {NO_HARNESS}")

import evaluation.lm  # noqa: F401  registers the gptlab model
from evaluation.tasks import check_include_path
from system import UserError, exits


def check_arguments(argv: list[str]) -> None:
    """UserError for an --include_path or a --limit the harness would take and fail on later."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--include_path")
    parser.add_argument("--limit", "-L")
    known, _ = parser.parse_known_args(argv)
    if known.include_path is not None:
        check_include_path(known.include_path, "--include_path ")
    try:
        refused = known.limit is not None and not float(known.limit) > 0
    except ValueError:  # not a number: the harness refuses it in its own words
        refused = False
    if refused:
        raise UserError(
            f"--limit {known.limit} evaluates no item of a task: give a count (200) or a fraction "
            "(0.1) above 0, or leave it out for every item"
        )


def main() -> None:
    with exits(out_of_memory="lower --batch_size"):  # a bad checkpoint or setting: one line, no traceback
        check_arguments(sys.argv[1:])
        cli_evaluate()


if __name__ == "__main__":
    main()
