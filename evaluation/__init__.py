"""Downstream tasks through EleutherAI's lm-evaluation-harness (the optional `eval` extra).

lm.py: the harness's `gptlab` model for any checkpoint; __main__.py: lm-eval's command line
knowing it; downstream.py: score a checkpoint on tasks (the top-level downstream.py's work);
after_training.py: score each run of a sweep as it ends; results.py: downstream.json beside a
checkpoint; tasks.py: check the user's task directory. Only lm.py, tasks.py and __main__.py
import the harness (downstream.py only when it runs tasks), so no other command pays for it.
"""

NO_HARNESS = 'downstream tasks need EleutherAI\'s lm-evaluation-harness: pip install -e ".[eval]"'
