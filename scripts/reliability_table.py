"""Render docs/reliability.md: the fault matrix, its test counts and a run's results.

::

    CWTRAIN_FAULT_RESULTS=/tmp/faults.json .venv-3.12/bin/python -m pytest -m faults tests -q
    .venv-3.12/bin/python scripts/reliability_table.py --results /tmp/faults.json   # writes the doc
    .venv-3.12/bin/python scripts/reliability_table.py --counts                    # JSON {row: tests}

Rows come from ``tests/faults/_fault_rows.py``. The test count of a row is the number of
tests marked ``faults`` and ``fault_row("<row>")``, found by collecting the suite
(``pytest --collect-only -m faults tests``, run in-process with a small plugin). Results
come from the JSON file the test session writes when ``CWTRAIN_FAULT_RESULTS`` is set
(``tests/conftest.py``): "holds (N/N)" when every test of the row passed, else the number
that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROWS_FILE = ROOT / "tests" / "faults" / "_fault_rows.py"
DOC = ROOT / "docs" / "reliability.md"

INTRO = """\
# Reliability: the fault matrix

Users train for days: one lost snapshot, or one replica serving corrupt weights, ruins a run.
The fault suite (`pytest -m faults tests`, part of `scripts/test.sh`) injects each fault below
through `cwtrain-local` (the local control plane, the S3 proxy in front of moto, the engine
replicas) or through the inputs and environment cwtrain reads, and checks what must hold.

- **Tests**: how many tests of the suite inject the fault (parametrized cases and
  hypothesis properties count once each; a property runs 20-30 generated examples).
- **Result**: from one run of the whole suite; "holds (N/N)" means all N tests passed.

The rows live in `tests/faults/_fault_rows.py`; every test carries
`@pytest.mark.fault_row("<row>")`, and `tests/faults/test_reliability_doc.py` fails when
this table's counts drift from the suite.
"""

CANARY = """\
## The canary: what it sees and what it does not

A hot-load that completes says only that every replica *reports* the new identity. The canary
(`cwtrain.integrations.rollout.Canary`) checks the weights behind it: after a hot-load, a fixed
probe (a few token-id prompts from the run's own data) is scored by the deployment (prompt
log-probs through `echo` + `logprobs` with `max_tokens` 1, and vLLM's `prompt_logprobs` where
the endpoint has it) and compared with the trainer's own log-probs of the same tokens. The gap
of one answer (one prompt, one request, so one replica) is the mean absolute difference over
its tokens, in nats: averaging over a prompt damps the rounding noise of single unlikely
tokens, while wrong weights move every token. The check's gap is the largest answer gap, so
one replica serving wrong weights fails it even when its peers are right and every answer
names the same identity; it also fails when an answer comes from another identity than the
one just hot-loaded. Answers are grouped by the identity that served them (the endpoint names
no replica); each prompt is sent `rounds` times (default 2) so that the router spreads the
requests over the replicas.

Measured on the local stack (the tiny model, 4 prompts, 140 tokens per round, 2 rounds, 2
replicas; `tests/faults/test_canary_faults.py` prints these with `pytest -s`, and
`tests/local/test_canary_engine.py` the float32 rows), against the default bound of 0.05:

| What the replicas serve | Gap | Mean / max token | Canary |
|---|---:|---:|---|
| the trainer's exact bytes (a FULL, then a delta) | 0 | 0 / 0 | passes |
| the BF16 copy of a float32 trainer's weights | 0.0008 | 0.0007 / 0.0023 | passes |
| one replica: a corrupted FULL under the new identity (`lm_head`'s exponent and top mantissa bits inverted) | 0.156 | 0.061 / 0.537 | fails |
| one replica: its previous weights under the new identity, one step behind (0.02 N(0, 1) added to half the tensors) | 0.101 | 0.040 / 0.291 | fails |
| one replica: its previous weights, a step ten times smaller | 0.011 | 0.004 / 0.030 | passes: not seen |
| the base weights, against a float32 trainer 0.02 N(0, 1) away on every tensor | 0.227 | 0.204 / 0.517 | fails |

It sees wrong or corrupted served weights (a bad FULL, a replica that applied nothing but
reports the new identity, a broken delta that passed its checks) and drift that accumulates
over versions. It does not necessarily see a one-version lag: one optimizer step can move the
probe's log-probs by less than trainer and engine numerics differ (the fifth row), and a real
run's steps are small. The served identity covers a lag: `verify` refuses a hot-load whose
replicas do not all serve its identity, and the sampler's version fence
(`CWTRAIN_ROLLOUT_MAX_STALENESS`) re-requests completions from an identity too many versions
behind. Nor does it see a replica the router never sent it to, or wrong weights that happen to
agree on the probe's tokens. Set the bound from a run's first check on known-good weights:
kernels that differ between trainer and engine add to BF16 rounding on real models.
"""

OUTRO = """\
## How this file is made

<!-- example: skip ci: the fault suite runs inside scripts/test.sh, and tests/faults/test_reliability_doc.py checks this table against it -->
```sh
CWTRAIN_FAULT_RESULTS=/tmp/faults.json .venv-3.12/bin/python -m pytest -m faults tests -q
.venv-3.12/bin/python scripts/reliability_table.py --results /tmp/faults.json
```

`scripts/reliability_table.py` reads the rows, counts the tests per row by collecting the
suite, and takes each row's result from the JSON the run wrote (`tests/conftest.py`).
"""


def load_rows(path: Path = ROWS_FILE) -> dict[str, tuple[str, str, str]]:
    """``ROWS`` of ``_fault_rows.py``: id -> (fault, how it is injected, what must hold)."""
    spec = importlib.util.spec_from_file_location("_fault_rows", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.ROWS)


class _RowCounter:
    """A pytest plugin counting the selected tests of each fault row."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            marker = item.get_closest_marker("fault_row")
            if marker is not None and item.get_closest_marker("faults") is not None:
                self.counts[marker.args[0]] = self.counts.get(marker.args[0], 0) + 1


def count_tests(tests: Path = ROOT / "tests") -> dict[str, int]:
    """Tests per fault row, by collecting ``-m faults`` in-process (nothing runs)."""
    import pytest

    counter = _RowCounter()
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = pytest.main(
            ["--collect-only", "-q", "-m", "faults", "-p", "no:cacheprovider", "--rootdir", str(ROOT), str(tests)],
            plugins=[counter],
        )
    if code not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"collecting the fault suite failed (pytest exit {code}):\n{output.getvalue()[-3000:]}")
    return counter.counts


def result_text(outcomes: dict[str, int] | None, count: int) -> str:
    """``holds (N/N)``, ``FAILS (k of N)``, or ``not run``."""
    if not outcomes:
        return "not run"
    failed = outcomes.get("failed", 0)
    passed = outcomes.get("passed", 0)
    skipped = outcomes.get("skipped", 0)
    if failed:
        return f"FAILS ({failed} of {count} failed)"
    text = f"holds ({passed}/{count})"
    return text + (f", {skipped} skipped" if skipped else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: dict[str, tuple[str, str, str]], counts: dict[str, int], results: dict[str, Any]) -> str:
    """The whole markdown document."""
    lines = [
        INTRO,
        "| Fault | How it is injected | Tests | What must hold | Result |",
        "|---|---|---:|---|---|",
    ]
    for row_id, (fault, injection, must_hold) in rows.items():
        count = counts.get(row_id, 0)
        lines.append(
            f"| {_cell(fault)} (`{row_id}`) | {_cell(injection)} | {count} | {_cell(must_hold)} "
            f"| {result_text(results.get(row_id), count)} |"
        )
    total = sum(counts.get(r, 0) for r in rows)
    seconds = (results.get("_session") or {}).get("seconds")
    took = f"the run took {seconds:.0f} s" if seconds else "the run was not timed"
    lines += [
        "",
        f"{len(rows)} rows, {total} tests; {took} on Python {platform.python_version()}.",
        "",
        CANARY,
        OUTRO,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write docs/reliability.md (or print the counts with ``--counts``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, help="JSON written by a run with CWTRAIN_FAULT_RESULTS")
    parser.add_argument("--counts", action="store_true", help="print {row: tests} as JSON and exit")
    parser.add_argument("--output", type=Path, default=DOC, help=f"the document ({DOC.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    counts = count_tests()
    if args.counts:
        print(json.dumps(counts, sort_keys=True))
        return 0
    rows = load_rows()
    unknown = sorted(set(counts) - set(rows))
    if unknown:
        raise SystemExit(f"tests name fault rows that _fault_rows.py lacks: {unknown}")
    results = json.loads(args.results.read_text()) if args.results else {}
    args.output.write_text(render(rows, counts, results))
    print(f"wrote {args.output} ({sum(counts.values())} tests in {len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
