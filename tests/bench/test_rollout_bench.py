"""Smoke run of bench/rollout.py against its fake endpoint (small, so only the plumbing is checked)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rollout.py"


def test_bench_reports_the_cpu_ratio() -> None:
    spec = importlib.util.spec_from_file_location("bench_rollout", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with bench.fake_endpoint() as (base_url, model, key):
        result = bench.measure(base_url, model, key, sequences=64, group=8, max_tokens=8, repeats=1)
    assert result["sequences_per_run"] == 64
    assert result["sampler_cpu_s_per_1000"] > 0 and result["plain_loop_cpu_s_per_1000"] > 0
    assert 0 < result["cpu_ratio"] < 1  # 8x fewer requests must cost less client CPU
