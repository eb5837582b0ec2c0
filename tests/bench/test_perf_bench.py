"""Smoke runs of bench/gpu.py, bench/pipeline.py, bench/codec.py --big and scripts/performance_doc.py (small sizes)."""

from __future__ import annotations

import importlib.util
import json
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def _load(relative: str) -> ModuleType:
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _json_out(capsys: pytest.CaptureFixture[str], main: Any, argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_gpu_bench_runs_on_cpu_tensors(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    bench = _load("bench/gpu.py")
    result = _json_out(capsys, bench.main, ["--device", "cpu", "--size", "1MiB", "--repeat", "1", "--json"])
    assert set(result["gb_per_s"]) >= {"xor+detect", "adler32", "host copy of the XOR", "adler32 (block loop, before)"}
    assert all(rate > 0 for rate in result["gb_per_s"].values())
    assert result["targets_apply"] is False and result["targets_pass"] is None  # targets are for a GPU
    assert bench.block_loop_adler32(bench.torch.arange(10, dtype=bench.torch.uint8)) == zlib.adler32(bytes(range(10)))


@pytest.fixture(scope="module")
def pipeline_run() -> dict[str, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("moto")
    bench = _load("bench/pipeline.py")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(["--sizes", "8MiB,16MiB", "--json"]) == 0
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_pipeline_bench_times_every_stage_in_one_publish(pipeline_run: dict[str, Any]) -> None:
    runs = pipeline_run["runs"]
    assert len(runs) == 2 and runs[0]["model_bytes"] < runs[1]["model_bytes"]
    for run in runs:
        assert {"gather", "read", "xor", "adler", "zstd", "sha256", "upload", "requests"} <= set(run["stages"])
        assert run["stages"]["adler"]["bytes"] == run["model_bytes"]  # every byte checksummed, once
        assert run["stages"]["sha256"]["bytes"] >= run["payload_bytes"]  # shards, index
        assert 0.002 < run["payload_ratio"] < 0.05 and run["shards"] == 1
        assert run["derived"]["overlap"] >= 1.0 and run["derived"]["floor_ratio"] > 0
        assert run["phases"]["encode_s"] + run["phases"]["tail_s"] == pytest.approx(run["wall_s"], rel=0.2, abs=0.05)
        assert run["cores_available"] > 0


def test_performance_doc_from_a_pipeline_run(pipeline_run: dict[str, Any], tmp_path: Path) -> None:
    script = _load("scripts/performance_doc.py")
    source = tmp_path / "pipeline.json"
    source.write_text(json.dumps(pipeline_run))
    out = tmp_path / "performance.md"
    code = script.main([str(source), "--out", str(out)])
    text = out.read_text()
    assert "| model | tensors | delta | wall s |" in text and "### Projections" in text
    for model in ("8B", "70B", "235B-A22B", "1T"):
        assert f"| {model} | 64 |" in text
    assert "No GPU was available" not in text  # no gpu run given: says so instead
    assert "No `bench/gpu.py` run was given." in text
    checked = script.checks(pipeline_run["runs"])
    outside = any(
        abs(c["own_error"]) > script.TOLERANCE or abs(c["projected_error"]) > script.TOLERANCE for c in checked
    )
    assert code == (1 if outside else 0)  # small runs on a busy machine may miss; the exit code says so
    assert all(c["own"] > 0 and c["projected"] > 0 for c in checked)


def test_cost_model_terms_scale_as_the_formula_says() -> None:
    script = _load("scripts/performance_doc.py")
    rates = script.Rates(
        cpu_s_per_gb={"gather": 0.0, "read": 0.02, "xor": 0.1, "adler": 0.07, "zstd": 0.5},
        sha_gb_per_s=1.5,
        link_gb_per_s=1.0,
        payload_ratio=0.015,
    )
    one = script.publish_terms(16e9, rates, script.Cluster(ranks=1, cores_per_rank=8))
    eight = script.publish_terms(16e9, rates, script.Cluster(ranks=8, cores_per_rank=8))
    assert one["encode"] == pytest.approx(16 * 0.5 / 8)  # the CPU's zstd bounds the device path
    assert eight["encode"] == pytest.approx(one["encode"] / 8) and eight["upload"] == pytest.approx(one["upload"] / 8)
    host = script.publish_terms(16e9, rates, script.Cluster(ranks=1, cores_per_rank=8, device_path=False))
    assert host["encode"] == pytest.approx(16 / 25 + 16 * 0.69 / 8)


def test_big_diff_mode_reports_peak_memory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bench = _load("bench/codec.py")
    argv = ["--big", "1280MiB", "--big-dense", "0", "--budget", "64MiB", "--dir", str(tmp_path), "--json"]
    result = _json_out(capsys, bench.main, argv)
    assert result["tensors"] == 2 and result["payload_bytes"] > 0
    assert result["peak_rss_bytes"] > 0 and result["within_limit"] is True
    assert list(tmp_path.iterdir()) == []  # scratch removed


def test_committed_performance_doc_is_what_the_script_makes_of_the_committed_runs(tmp_path: Path) -> None:
    script = _load("scripts/performance_doc.py")
    argv = [arg if arg.startswith("--") else str(ROOT / arg) for arg in script.REGENERATE]
    out = tmp_path / "performance.md"
    assert script.main([*argv, "--out", str(out)]) == 0  # issue 20's check holds for the committed runs
    assert out.read_text() == (ROOT / "docs" / "performance.md").read_text()


# ------------------------------------------------------------------------------ issue 25: bench/cadence.py


def test_cadence_bench_runs_both_policies_on_the_local_stack(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    bench = _load("bench/cadence.py")
    argv = ["--versions", "22", "--phases", "8:0.005,6:1.0,8:0.005", "--ulps", "4096", "--json"]
    code = bench.main(argv)
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    auto, fixed = doc["phased"]["auto"], doc["phased"]["fixed"]
    assert [len(run["versions"]) for run in (auto, fixed)] == [23, 23]  # the baseline and 22 versions
    assert all(r["type"] == "FULL" and r["cut_reason"] == "first" for r in (auto["versions"][0], fixed["versions"][0]))
    # every value moved by up to 4096 ulps for six versions: auto cuts by share or replay, the fixed 20 does not
    assert set(auto["full_reasons"]) - {"first", "count"} and fixed["full_reasons"] == {"first": 1, "count": 1}
    assert all(r["replay_bytes"] <= 3 * auto["full_bytes"] for r in auto["versions"])
    assert fixed["worst_replay_bytes"] > 3 * fixed["full_bytes"]
    assert auto["bytes_stored"] == sum(r["snapshot_bytes"] for r in auto["versions"]) and auto["encode_seconds"] > 0
    # a run that stays sparse: the same snapshots with either policy (auto's count bound is 20)
    assert bench.same_snapshots(doc["sparse"]["auto"], doc["sparse"]["fixed"])
    assert doc["acceptance"] == bench.acceptance(doc) and doc["acceptance"]["sparse_run_same_snapshots"]
    assert code == (0 if all(doc["acceptance"].values()) else 1)
    script = _load("scripts/performance_doc.py")
    section = script.cadence_section(doc)
    assert "| `auto` / fixed |" in section and "A run that stays at 0.5% throughout:" in section


def test_the_committed_cadence_run_meets_issue_25() -> None:
    bench = _load("bench/cadence.py")
    doc = json.loads((ROOT / "bench" / "results" / "cadence.json").read_text())
    assert doc["settings"]["versions"] == 100 and doc["settings"]["fixed"] == 20
    checks = bench.acceptance(doc)  # recomputed from the per-version figures, not the stored verdict
    assert checks == doc["acceptance"] and all(checks.values()), checks
    for pair in (doc["phased"], doc["sparse"]):
        for run in (pair["auto"], pair["fixed"]):
            assert bench.summarize(run["run_id"], run["full_every"], run["versions"]) == run
    auto, fixed = doc["phased"]["auto"], doc["phased"]["fixed"]
    assert auto["worst_replay_bytes"] <= 0.5 * fixed["worst_replay_bytes"]
    assert auto["bytes_stored"] <= 1.3 * fixed["bytes_stored"]
