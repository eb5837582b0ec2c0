"""Client CPU per 1,000 sampled sequences: the rollout sampler vs a plain per-sequence loop.

Both sides use the same ``httpx.AsyncClient`` (the sampler's own connection pool) against
the same endpoint in the same run; only this process's CPU time is counted
(``time.process_time``: every thread of the client, none of the server's processes).

- **sampler**: ``CompletionSampler.sample_groups`` — one request per group with ``n`` =
  group size, exact ids and log-probs read and checked.
- **plain loop**: one ``n = 1`` request per sequence, awaited one after another, reading
  ``token_ids`` and ``token_logprobs`` from each answer.

Endpoints: ``--endpoint local`` (default) starts ``cwtrain.local.LocalStack`` and samples
its gateway (the tiny model on engine replicas); ``--endpoint fake`` serves canned answers
from a child process (no torch needed, fastest). Goal (issue 7): ratio <= 0.5.

    .venv-3.12/bin/python bench/rollout.py --endpoint fake --sequences 1000 --group 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, SamplingParams

MODEL = "bench-model"


# ----------------------------------------------------------------- fake endpoint


class _FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        choices = []
        for i in range(body["n"]):
            ids = [(sum(prompt) + 7 * i + 3 * j) % 60 + 2 for j in range(body["max_tokens"])]
            choices.append(
                {
                    "index": i,
                    "text": "".join(chr(97 + t % 26) for t in ids),
                    "finish_reason": "length",
                    "token_ids": ids,
                    "prompt_token_ids": prompt,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": [-0.5 - 0.01 * j for j in range(len(ids))],
                    },
                }
            )
        out = json.dumps({"object": "text_completion", "model": MODEL, "choices": choices,
                          "system_fingerprint": "bench-v000001"}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def _serve_fake() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHandler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


@contextmanager
def fake_endpoint() -> Iterator[tuple[str, str, str | None]]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-fake"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1", MODEL, None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def local_endpoint() -> Iterator[tuple[str, str, str | None]]:
    from cwtrain.local import LocalStack

    with LocalStack(replicas=2) as stack:
        target = stack.deploy(name="bench")
        yield target.base_url, target.model, stack.token


# ------------------------------------------------------------------- the runs


def _prompts(count: int) -> list[list[int]]:
    return [[2 + (p * 7 + k) % 50 for k in range(12)] for p in range(count)]


async def plain_loop(sampler: CompletionSampler, prompts: list[list[int]], group: int, max_tokens: int) -> int:
    """One request per sequence, awaited in turn, with the sampler's own httpx client."""
    client = sampler._http()
    url = sampler.config.completions_url
    sequences = 0
    for prompt in prompts:
        for _ in range(group):
            body = {
                "model": sampler.config.model,
                "prompt": prompt,
                "n": 1,
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
                "stream": False,
                "logprobs": 1,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }
            response = await client.post(url, json=body)
            response.raise_for_status()
            choice = response.json()["choices"][0]
            ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
            assert len(ids) == len(logprobs)
            sequences += 1
    return sequences


def measure(
    base_url: str, model: str, key: str | None, sequences: int, group: int, max_tokens: int, repeats: int
) -> dict[str, Any]:
    prompts = _prompts(max(1, sequences // group))
    total = len(prompts) * group
    params = SamplingParams(max_tokens=max_tokens)
    config = RolloutConfig(base_url, model, api_key=key, concurrency=16)
    rows: list[dict[str, float]] = []
    with CompletionSampler(config, group_size=group) as sampler:
        sampler.sample_groups_sync(prompts[:4], group, params)  # warm both paths and the pool
        sampler._runner.submit(plain_loop(sampler, prompts[:2], group, max_tokens)).result()
        for _ in range(repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            batch = sampler.sample_groups_sync(prompts, group, params)
            s_cpu, s_wall = time.process_time() - cpu, time.perf_counter() - wall
            assert sum(len(g) for g in batch) == total
            cpu, wall = time.process_time(), time.perf_counter()
            done = sampler._runner.submit(plain_loop(sampler, prompts, group, max_tokens)).result()
            p_cpu, p_wall = time.process_time() - cpu, time.perf_counter() - wall
            assert done == total
            rows.append({"sampler_cpu": s_cpu, "plain_cpu": p_cpu, "sampler_wall": s_wall, "plain_wall": p_wall})
    per_k = 1000.0 / total
    sampler_cpu = statistics.median(r["sampler_cpu"] for r in rows) * per_k
    plain_cpu = statistics.median(r["plain_cpu"] for r in rows) * per_k
    return {
        "sequences_per_run": total,
        "group_size": group,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "sampler_cpu_s_per_1000": round(sampler_cpu, 4),
        "plain_loop_cpu_s_per_1000": round(plain_cpu, 4),
        "cpu_ratio": round(sampler_cpu / plain_cpu, 4),
        "sampler_wall_s": round(statistics.median(r["sampler_wall"] for r in rows), 3),
        "plain_loop_wall_s": round(statistics.median(r["plain_wall"] for r in rows), 3),
        "goal_cpu_ratio_at_most": 0.5,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", choices=("local", "fake"), default="local")
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        _serve_fake()
        return 0
    endpoint = local_endpoint if args.endpoint == "local" else fake_endpoint
    with endpoint() as (base_url, model, key):
        result = measure(base_url, model, key, args.sequences, args.group, args.max_tokens, args.repeats)
    result["endpoint"] = args.endpoint
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    return 0 if result["cpu_ratio"] <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
