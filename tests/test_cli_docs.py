"""docs/cli.md is current: every command of the CLI, and every option of it, is documented there."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from cwtrain.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
#: Commands other packages document in their own pages.
ELSEWHERE = {"gym"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for group, parser in _subparsers(build_parser()).items():
        if group in ELSEWHERE:
            continue
        commands = _subparsers(parser)
        if not commands:
            yield group, parser
        for command, sub in commands.items():
            yield f"{group} {command}", sub


COMMANDS = dict(_commands())


def test_the_core_and_local_commands_are_all_there() -> None:
    assert {"deployment list", "gateway list", "hotload publish", "snapshot diff", "local up", "demo"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_and_option_is_in_the_cli_doc(name: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert f"`{name}" in text, f"docs/cli.md does not document `cwtrain {name}`"
    actions = [tuple(a.option_strings) for a in COMMANDS[name]._actions if a.option_strings and a.dest != "help"]
    if name == "demo":  # the demo's many tuning options are listed by `cwtrain demo --help`
        actions = [
            (o,)
            for o in (
                "--steps",
                "--seed",
                "--replicas",
                "--full-every",
                "--group-size",
                "--report",
                "--json",
                "--json-file",
            )
        ]

    def mentioned(option: str) -> bool:
        return any(f"{before}{option}{after}" in text for before in "`[ " for after in "` ]")

    missing = sorted(strings[-1] for strings in actions if not any(mentioned(o) for o in strings))
    assert not missing, f"docs/cli.md does not mention {missing} of `cwtrain {name}`"


def _rows(text: str) -> dict[str, str]:
    """Each command table row of docs/cli.md by its command (``| `hotload list` | options | does |``)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        words = cells[0].strip("`").split(" ")
        if len(cells) >= 2 and cells[0].startswith("`") and len(words) >= 2:
            rows[f"{words[0]} {words[1]}"] = cells[1]
    return rows


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if " " in n))
def test_options_the_doc_calls_required_are_required(name: str) -> None:
    """Issue 27: `hotload list --deployment` was marked required although the environment default applies."""
    row = _rows(DOC.read_text(encoding="utf-8")).get(name, "")
    said = re.findall(r"`(--[\w-]+)[^`]*` \(required\)", row)
    required = {s for a in COMMANDS[name]._actions if a.required for s in a.option_strings}
    assert set(said) <= required, f"docs/cli.md marks {sorted(set(said) - required)} of `cwtrain {name}` required"
