"""Regenerate docs/configuration.md from cwtrain.config.VARIABLES and PublishOutcome's fields (run after adding one)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from cwtrain.config import VARIABLES
from cwtrain.hotload import PublishOutcome

HEADER = """# Configuration

Every environment variable cwtrain reads. Precedence: explicit argument, then framework
config key (e.g. `coreweave_cfg.*`), then the variable, then the default. Booleans accept
`1/true/yes/on` and `0/false/no/off` (any case); a blank value counts as unset; anything
else is an error naming the variable. Secrets (marked) never appear in logs, errors or
JSON output.

Generated from `cwtrain.config.VARIABLES` by `scripts/gen_config_docs.py`.

| Variable | Default | Meaning |
|---|---|---|
"""


METRICS = """
## Metrics: `hotload/*`

Every publisher (slime, miles, NeMo-RL, the demo, a `PublishSession` of your own) reports each
version with the same figures: one per field of `cwtrain.hotload.PublishOutcome`, as
`hotload/<field>` (`PublishOutcome.metrics()`), in the framework's logger. Seconds are wall
time; 1/0 are yes/no.

Generated from `PublishOutcome`'s docstring by `scripts/gen_config_docs.py`.

| Metric | What it counts |
|---|---|
"""


def outcome_fields() -> dict[str, str]:
    """``PublishOutcome``'s attributes and their descriptions (its docstring's ``Attributes:`` section, one line each)."""
    doc = inspect.cleandoc(PublishOutcome.__doc__ or "")
    section = doc.split("Attributes:", 1)[1]
    described: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name, text = match.groups()
            described[name] = text
        elif name is not None and line.startswith("        "):
            described[name] += " " + line.strip()
    return described


def render() -> str:
    rows = []
    for var in VARIABLES.values():
        secret = " (secret)" if var.secret else ""
        rows.append(f"| `{var.name}` | {var.default} | {var.description}{secret} |")
    described = outcome_fields()
    metrics = []
    for key in PublishOutcome(version=0).metrics():
        field = key.removeprefix("hotload/")
        text = re.sub(
            r":(?:class|meth|mod|func):`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", described[field]
        )
        metrics.append(f"| `{key}` | {text.replace('``', '`').replace('|', '\\|')} |")
    return HEADER + "\n".join(rows) + "\n" + METRICS + "\n".join(metrics) + "\n"


if __name__ == "__main__":
    Path(__file__).resolve().parents[1].joinpath("docs", "configuration.md").write_text(render())
