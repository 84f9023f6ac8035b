"""Downstream tasks through EleutherAI's lm-evaluation-harness (the optional `eval` extra).

lm.py is the harness's model class for any gptlab checkpoint, registered as `gptlab`;
`python -m evaluation` is lm-eval's own command line with that model known to it;
downstream.py scores a checkpoint on tasks (downstream.py at the top of the repository is its
command line); after_training.py scores each run of a sweep as it ends (a Hydra callback an
experiment names); results.py reads and writes downstream.json, the figures beside a
checkpoint; tasks.py checks a directory of the user's own task files. Only lm.py, tasks.py
and __main__.py import the harness, and downstream.py imports them only when it runs tasks,
so no other command pays for the harness's imports.
"""

NO_HARNESS = 'downstream tasks need EleutherAI\'s lm-evaluation-harness: pip install -e ".[eval]"'
