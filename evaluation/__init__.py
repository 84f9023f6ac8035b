"""Downstream tasks through EleutherAI's lm-evaluation-harness (the optional `eval` extra).

lm.py is the harness's model class for any gptlab checkpoint, registered as `gptlab`;
`python -m evaluation` is lm-eval's own command line with that model known to it. The
harness is imported only by those two, never by the other commands.
"""
