"""Regenerate docs/configuration.md from cwtrain.config.VARIABLES (run after adding a variable)."""

from __future__ import annotations

from pathlib import Path

from cwtrain.config import VARIABLES

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


def render() -> str:
    rows = []
    for var in VARIABLES.values():
        secret = " (secret)" if var.secret else ""
        rows.append(f"| `{var.name}` | {var.default} | {var.description}{secret} |")
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    Path(__file__).resolve().parents[1].joinpath("docs", "configuration.md").write_text(render())
