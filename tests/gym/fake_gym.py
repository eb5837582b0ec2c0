"""A stand-in for NeMo Gym's ``gym`` command line (real Gym is not installable here).

Implements the two commands cwtrain's default collector runs, with Gym's argument shapes:

* ``gym env start --config A --config B ...``: merges the YAML configs in order (later
  wins, as Gym's ``config_paths`` do), records the policy endpoint it would serve
  (``policy_base_url``, ``policy_api_key``, ``policy_model_name``, the ``vllm_model`` block)
  in ``$FAKE_GYM_STATE``, prints Gym's ``All N / N servers ready!`` line and runs until
  SIGINT/SIGTERM (then records ``stopped``). ``FAKE_GYM_SERVE_FAIL=1`` exits 3 at once;
  ``FAKE_GYM_NEVER_READY=1`` never prints the ready line.
* ``gym eval run --no-serve --input IN --output OUT [--agent A] [--num-repeats K]
  [--limit N] [--concurrency C] [--prompt-config P]``: for each row and repeat, sends one
  real ``POST {policy_base_url}/completions`` with the recorded key and model, writes one
  rollout per line (``reward`` = the row's ``fake_reward`` when the endpoint answered,
  ``agent_ref``, the ``response``), and ``<stem>_aggregate_metrics.json`` beside it. As
  real Gym does, it prints its progress and metric blocks on *stdout*, and a prompt config
  (``user:`` template, ``{field}`` from the row) builds the input of rows that have only
  fields (rows without ``responses_create_params`` and no prompt config crash with a
  ``KeyError``, as Gym 0.6 does). ``FAKE_GYM_EVAL_FAIL=1`` exits 2 without writing;
  ``FAKE_GYM_EVAL_SLEEP=S`` waits S seconds first (time for a test to interrupt the evaluation).

Every invocation appends its argv to ``$FAKE_GYM_LOG`` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _interpolate(value: Any, config: dict[str, Any]) -> Any:
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return config.get(value[2:-1])
    return value


def env_start(configs: list[str]) -> int:
    if os.environ.get("FAKE_GYM_SERVE_FAIL") == "1":
        print("resources server crashed", flush=True)
        return 3
    merged: dict[str, Any] = {}
    for path in configs:
        merged = _merge(merged, yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
    server = merged.get("policy_model", {}).get("responses_api_models", {}).get("vllm_model", {})
    state = {
        "base_url": merged.get("policy_base_url"),
        "api_key": merged.get("policy_api_key"),
        "model": merged.get("policy_model_name"),
        "vllm_model": {k: _interpolate(v, merged) for k, v in server.items()},
        "configs": configs,
        "pid": os.getpid(),
        "stopped": False,
    }
    state_path = Path(os.environ["FAKE_GYM_STATE"])
    state_path.write_text(json.dumps(state), encoding="utf-8")

    def stop(signum: int, frame: Any) -> None:
        state["stopped"] = True
        state_path.write_text(json.dumps(state), encoding="utf-8")
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print("Starting servers...", flush=True)
    if os.environ.get("FAKE_GYM_NEVER_READY") != "1":
        print("All 3 / 3 servers ready!", flush=True)
    while True:
        time.sleep(0.1)


def eval_run(args: argparse.Namespace) -> int:
    if os.environ.get("FAKE_GYM_EVAL_FAIL") == "1":
        print("rollout collection failed", file=sys.stderr)
        return 2
    time.sleep(float(os.environ.get("FAKE_GYM_EVAL_SLEEP", "0")))
    state = json.loads(Path(os.environ["FAKE_GYM_STATE"]).read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.limit is not None:
        rows = rows[: args.limit]
    output = Path(args.output)
    template = None
    if args.prompt_config:
        template = yaml.safe_load(Path(args.prompt_config).read_text(encoding="utf-8"))["user"]
        print(f"Using prompt config: {args.prompt_config}", flush=True)
    print(f"Querying with {args.concurrency or 1} concurrent requests", flush=True)
    results = []
    for row in rows:
        agent = (row.get("agent_ref") or {}).get("name") or args.agent
        if template is not None:
            if "responses_create_params" in row:
                print("rows with responses_create_params cannot take a prompt config", file=sys.stderr)
                return 1
            row["responses_create_params"] = {"input": [{"role": "user", "content": template.format(**row)}]}
        prompt = row["responses_create_params"]["input"][-1]["content"]
        for _ in range(args.num_repeats):
            body = {"model": state["model"], "prompt": prompt, "max_tokens": 4, "temperature": 1.0}
            request = urllib.request.Request(
                state["base_url"].rstrip("/") + "/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {state['api_key']}"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
            text = answer["choices"][0]["text"]
            results.append(
                {
                    "reward": float(row.get("fake_reward", 1.0)),
                    "agent_ref": {"name": agent},
                    "response": {"output_text": text, "model": answer.get("model")},
                }
            )
            print(json.dumps({"reward": results[-1]["reward"]}, indent=4), flush=True)
    output.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    print(f"Finished rollout collection! View results at:\nRollouts: {output}", flush=True)
    metrics = [{"agent_ref": {"name": args.agent}, "agent_metrics": {"rollouts": len(results)}, "key_metrics": {}}]
    output.with_name(output.stem + "_aggregate_metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    return 0


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_GYM_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(argv) + "\n")
    parser = argparse.ArgumentParser(prog="gym")
    groups = parser.add_subparsers(dest="group", required=True)
    env = groups.add_parser("env").add_subparsers(dest="command", required=True)
    start = env.add_parser("start")
    start.add_argument("--config", action="append", required=True)
    ev = groups.add_parser("eval").add_subparsers(dest="command", required=True)
    run = ev.add_parser("run")
    run.add_argument("--no-serve", action="store_true", required=True)
    run.add_argument("--input", required=True)
    run.add_argument("--output", required=True)
    run.add_argument("--agent")
    run.add_argument("--num-repeats", type=int, default=1)
    run.add_argument("--limit", type=int)
    run.add_argument("--concurrency", type=int)
    run.add_argument("--prompt-config")
    args = parser.parse_args(argv)
    if args.group == "env":
        return env_start(args.config)
    return eval_run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
