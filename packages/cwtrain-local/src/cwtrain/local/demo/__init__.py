"""``cwtrain demo``: a real GRPO loop against the local stack.

``run`` (the loop: train, publish, hot-load, sample), ``grpo`` (the trainer's step on the tiny
model), ``report`` (the live display and the summary) and ``page`` (the self-contained HTML report).
"""
