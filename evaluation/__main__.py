"""lm-eval's command line with the `gptlab` model registered (lm-eval 0.4's own `lm_eval`
command knows only the harness's models):

    python -m evaluation --model gptlab --model_args checkpoint=runs/<run> --device cuda --tasks hellaswag

Every option is lm-eval's (`python -m evaluation --help`).
"""

from lm_eval.__main__ import cli_evaluate

import evaluation.lm  # noqa: F401  registers the gptlab model
from system import exits

if __name__ == "__main__":
    with exits(out_of_memory="lower --batch_size"):  # a bad checkpoint or setting: one line, no traceback
        cli_evaluate()
