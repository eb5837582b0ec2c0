"""docs/cli.md is current: every command of the CLI, and every option of it, is documented there."""

from __future__ import annotations

import argparse
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
