"""Reward functions loaded by --custom-rm-path in the rollout tests (slime's signatures)."""

from __future__ import annotations

from typing import Any


async def per_sample(args: Any, sample: Any, **kwargs: Any) -> float:
    return float(sample.response_length)


async def per_group(args: Any, samples: list[Any], **kwargs: Any) -> list[float]:
    best = max(s.response_length for s in samples)
    return [1.0 if s.response_length == best else 0.0 for s in samples]
