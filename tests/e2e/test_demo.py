"""``cwtrain demo`` end to end, kept short (the full-length run is CI's ``cwtrain demo``)."""

from __future__ import annotations

import argparse
import io
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from cwtrain.local.demo import run as demo

pytestmark = pytest.mark.e2e


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(list(argv))


def _check_run(summary: dict[str, Any], steps: int, replicas: int) -> None:
    records = summary["steps"]
    assert [r["step"] for r in records] == list(range(steps + 1))
    assert [r["identity"] for r in records] == [f"demo-s0-v{i:06d}" for i in range(steps + 1)]
    assert records[0]["snapshot_type"] == "FULL" and records[0]["mean_reward"] is None
    assert all(0.0 <= r["mean_reward"] <= 1.0 for r in records[1:])
    assert summary["every_replica_served_every_version"] and summary["rollouts_served_by_latest"]
    assert all(r["replicas_serving"] == replicas for r in records)
    # every rollout of step k was served by the identity published at step k - 1
    for prev, rec in itertools.pairwise(records):
        assert rec["served_identities"] == [prev["identity"]]
    for rec in records[1:]:
        # BF16 serving vs float32 training: close but not identical log-probs
        assert rec["logprob_gap"] is not None and 0 <= rec["logprob_gap"] < 0.05
    assert summary["final_identity"] == records[-1]["identity"]
    # everything was torn down: the gateway no longer answers
    with pytest.raises(httpx.TransportError):
        httpx.get(summary["rollout_base_url"] + "/models", timeout=2)


def test_demo_cli_handler_publishes_deltas_and_fulls(cli_run: dict[str, Any]) -> None:
    assert cli_run["code"] == 0
    summary = json.loads(cli_run["out"])  # --json: exactly one JSON document on stdout
    assert json.loads(cli_run["json_file"].read_text()) == summary  # --json-file: the same document
    assert summary["task"] == demo.TASK and summary["pass_rule"] == demo.PASS_RULE
    err = cli_run["err"]
    _check_run(summary, steps=3, replicas=2)
    types = [r["snapshot_type"] for r in summary["steps"]]
    assert types == ["FULL", "INCREMENTAL", "FULL", "INCREMENTAL"]
    assert (summary["full_snapshots"], summary["delta_snapshots"]) == (2, 2)
    # --full-every 2: each FULL says why it was cut; the replay is the chain's FULL and its deltas
    records = summary["steps"]
    assert [r["cut_reason"] for r in records] == ["first", "none", "count", "none"]
    assert summary["full_reasons"] == {"first": 1, "count": 1} and "replay_budget_bytes" not in summary
    sizes = [r["snapshot_bytes"] for r in records]
    assert [r["replay_bytes"] for r in records] == [sizes[0], sizes[0] + sizes[1], sizes[2], sizes[2] + sizes[3]]
    assert (summary["max_replay_bytes"], summary["max_replay_step"]) in (
        (sizes[0] + sizes[1], 1),
        (sizes[2] + sizes[3], 3),
    )
    delta = summary["steps"][1]
    assert 0 < delta["snapshot_bytes"] < summary["steps"][0]["snapshot_bytes"]
    assert delta["tensors_changed"] > 0
    assert "step   3/3" in err and "median publish" in err and "everything torn down" in err
    assert (
        "FULL/first" in err and "FULL/count" in err and "FULL snapshots by reason" in err and "count 1, first 1" in err
    )
    assert f"report: {cli_run['report']}" in err and cli_run["report"].is_file()
    assert f"figures (JSON): {cli_run['json_file']}" in err
    # the summary comes last: the table, then the verdict and nothing after it
    lines = err.rstrip("\n").splitlines()
    verdict = "reward climbed: final" if summary["reward_goal_met"] else "reward did NOT reach the goal: final"
    assert lines[-1].startswith(f"{verdict} {summary['final_reward']:.3f}")
    assert lines[-1].endswith("; everything torn down.")
    table = lines.index(next(line for line in lines if line.startswith("summary ")))
    assert table > lines.index(next(line for line in lines if line.startswith("step   3/3")))
    assert lines[table + 2].startswith("task ") and "parity digits" in lines[table + 2]


def test_demo_is_reproducible_with_seed(
    cli_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same seed, other replica count and cadence (``auto``, the default): the same rollouts, rewards and weights.

    This run goes through the handler without ``--json``: nothing on stdout, the summary last on stderr.
    """
    first = json.loads(cli_run["out"])
    figures = tmp_path / "second.json"
    code = demo.main(_args("--steps", "4", "--replicas", "1", "--no-check", "--json-file", str(figures)))
    out, err = capsys.readouterr()
    assert code == 0 and out == ""  # the JSON only where it was asked for
    assert err.rstrip("\n").splitlines()[-1].endswith("; everything torn down.")
    second = json.loads(figures.read_text())
    assert second["rewards"][:3] == first["rewards"][:3]
    keys = ("identity", "mean_reward", "logprob_gap", "served_identities")
    assert [[r[k] for k in keys] for r in second["steps"][:4]] == [[r[k] for k in keys] for r in first["steps"][:4]]
    # step 1 is a delta in both runs: byte-identical snapshots
    assert second["steps"][1]["snapshot_bytes"] == first["steps"][1]["snapshot_bytes"]
    # auto: deltas of about half a FULL stay deltas for three steps; the fourth would make a cold
    # replica read more than the FULL and two FULLs of deltas, so it is cut FULL, and says so
    assert second["config"]["full_every"] == "auto"
    assert [(r["snapshot_type"], r["cut_reason"]) for r in second["steps"]] == [
        ("FULL", "first"), *[("INCREMENTAL", "none")] * 3, ("FULL", "replay")
    ]  # fmt: skip
    assert second["replay_budget_bytes"] == 3 * second["steps"][0]["snapshot_bytes"]
    assert second["steps"][4]["replay_bytes"] == second["steps"][4]["snapshot_bytes"]  # a new chain
    assert "FULL/replay" in err and "FULL snapshots by reason" in err and "first 1, replay 1" in err


def test_demo_one_step_ahead_trains_while_the_last_version_hot_loads(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ahead`` with hot-loads slower than a rollout: each step's samples come from the version before."""
    summary = demo.run_demo(demo.DemoConfig(steps=3, ahead=True, slow_hot_load=0.5, check=False))
    err = capsys.readouterr().err
    records = summary["steps"]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["identity"] for r in records] == [f"demo-s0-v{i:06d}" for i in range(4)]
    assert summary["every_replica_served_every_version"]
    # the canary checks each version against the weights handed over, not the trainer's moved-on ones
    assert all(r["canary_gap"] is not None and r["canary_gap"] < 0.05 for r in records)
    # step 1 samples the baseline (served before any rollout); later steps the version before the last
    assert records[1]["sample_staleness"] == 0
    assert [r["sample_staleness"] for r in records[2:]] == [1, 1]  # the last version was still hot-loading
    assert summary["max_sample_staleness"] == 1 and summary["max_staleness_allowed"] == 1
    assert all(r["trainer_wait_seconds"] >= 0 for r in records) and summary["median_trainer_wait_seconds"] is not None
    assert "waited" in err  # each step's line
    table = io.StringIO()
    demo.print_summary(summary, table)
    assert "rollouts at most 1 version behind the trainer  yes (worst 1)" in table.getvalue()
    assert "(one step ahead)" in table.getvalue()


def test_bad_options_are_refused() -> None:
    from cwtrain.errors import ConfigError

    with pytest.raises(ConfigError, match="--group-size"):
        demo.main(_args("--group-size", "1"))
    with pytest.raises(ConfigError, match="--slow-hot-load"):
        demo.main(_args("--slow-hot-load", "-1"))
    assert _args().full_every == "auto" and _args("--full-every", " AUTO ").full_every == "auto"
    assert _args("--full-every", "0").full_every == 0
    for bad in ("65", "-1", "sometimes"):
        with pytest.raises(SystemExit) as exit_info:  # argparse: a usage line naming the option, exit 2
            _args("--full-every", bad)
        assert exit_info.value.code == 2
    with pytest.raises(ConfigError, match="--full-every"):
        demo.main(argparse.Namespace(**{**vars(_args()), "full_every": 65}))


def test_bad_output_paths_are_refused_before_the_run(tmp_path: Path) -> None:
    from cwtrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--json-file .* is a directory"):
        demo.main(_args("--json-file", str(tmp_path)))
    with pytest.raises(ConfigError, match=r"--report .* is a directory"):
        demo.main(_args("--report", str(tmp_path)))


def test_help_states_the_task_and_the_pass_rule(capsys: pytest.CaptureFixture[str]) -> None:
    from cwtrain.cli import main

    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert 'Task: parity digits: each prompt is "even: " or "odd: "' in text
    assert "Pass rule: exit 0 when the final step's mean reward is at least 0.5 and at least twice the first" in text
    assert "--json " in text and "--json-file PATH" in text
