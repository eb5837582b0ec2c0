"""Read the shell and Python examples out of the Markdown docs, and run them as a reader would.

Used by ``tests/test_doc_examples.py``; the rules for doc authors are in its docstring. This
module holds the two halves:

* :func:`parse` finds every fenced block of a Markdown file with its info string (the
  language) and the ``<!-- example: ... -->`` marks written on the lines just above it;
* :class:`Shell` is one terminal: a ``bash`` process fed the blocks on its standard input,
  one after the other, so that variables, ``cd`` and ``source`` carry from one block to the
  next exactly as they do for a reader typing them; a block can also be left running (a
  server started in the foreground of its own terminal) and is then stopped with SIGINT,
  as Ctrl-C stops it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Info strings of blocks that are examples to run.
SHELL_LANGS = frozenset({"bash", "sh", "shell"})
PYTHON_LANGS = frozenset({"python", "py"})
#: Info strings of blocks that show data or output, never run.
DATA_LANGS = frozenset({"text", "json", "jsonl", "yaml", "toml", "ini", "console", "diff", "html", "csv"})
#: Why an example may stay unrun: the kinds of ``<!-- example: skip KIND: REASON -->``.
SKIP_KINDS = {
    "cluster": "needs a CoreWeave account or something only the real service has",
    "gpu": "needs a CUDA device",
    "framework": "needs a training framework's own environment (slime, miles, NeMo-RL, NeMo Gym)",
    "ci": "runs elsewhere: the reason names the file that runs it (.ci/run, scripts/test.sh, a test)",
    "install": "installs packages (tests/test_docs_install.py checks every install line)",
}
#: A file-level mark: its examples start without a local stack (they start their own).
OWN_STACK = "<!-- examples: own local stack -->"
#: ``<!-- examples: environment PROFILE -->``: the doc runs in that profile's environment (tests/test_doc_examples.py).
ENVIRONMENT = re.compile(r"<!--\s*examples:\s*environment\s+([a-z]+)\s*-->")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_COMMENT_START = re.compile(r"^[ \t]*<!--\s*example:\s*(?P<body>.*)$", re.DOTALL)


@dataclass
class Example:
    """One fenced block and its marks.

    Attributes:
        path: the Markdown file.
        line: the line of its opening fence (1-based).
        lang: the first word of the info string (lower case; empty when there is none).
        code: the block's text, de-indented.
        skip: ``(kind, reason)`` of a skip mark, else ``None``.
        shell: the terminal it runs in (``main`` unless marked ``shell NAME``).
        background_until: for ``background until TEXT``: started and left running once TEXT appears.
        setup: hidden shell lines run just before it (``<!-- example: setup ... -->``).
        errors: what is wrong with its marks.
    """

    path: Path
    line: int
    lang: str
    code: str
    skip: tuple[str, str] | None = None
    shell: str = "main"
    background_until: str | None = None
    setup: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        parts = self.path.parts
        shown = "/".join(parts[-3:]) if len(parts) > 2 and parts[-3] == "packages" else self.path.name
        return f"{shown}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in SHELL_LANGS | PYTHON_LANGS and self.skip is None


def _apply(example: Example, directive: str) -> None:
    text = directive.strip()
    if text.startswith("skip"):
        match = re.fullmatch(r"skip\s+(\w+)\s*:\s*(.+)", text, re.DOTALL)
        if not match:
            example.errors.append(f"a skip mark needs a kind and a reason: 'skip KIND: REASON', got {text!r}")
        elif match.group(1) not in SKIP_KINDS:
            example.errors.append(f"unknown skip kind {match.group(1)!r}; one of {sorted(SKIP_KINDS)}")
        else:
            example.skip = (match.group(1), " ".join(match.group(2).split()))
    elif text.startswith("setup"):
        example.setup += text[len("setup") :].strip("\n") + "\n"
    elif match := re.fullmatch(r"shell\s+([\w-]+)", text):
        example.shell = match.group(1)
    elif match := re.fullmatch(r"background\s+until\s+(.+)", text, re.DOTALL):
        example.background_until = match.group(1).strip().strip("\"'")
    else:
        example.errors.append(f"unknown example mark {text!r}")


def parse(path: Path) -> list[Example]:
    """Every fenced block of ``path``, with the ``<!-- example: ... -->`` marks just above it.

    Marks are HTML comments (invisible when the page is rendered) on the lines right above
    the opening fence; blank lines may stand between them and the fence, nothing else.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    examples: list[Example] = []
    pending: list[str] = []
    pending_errors: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        start = _COMMENT_START.match(line)
        if start:
            body = start.group("body")
            while "-->" not in body:
                i += 1
                if i == len(lines):
                    pending_errors.append(f"line {i}: an example mark is not closed with -->")
                    break
                body += "\n" + lines[i]
            pending.append(body.split("-->", 1)[0])
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            indent, marker = fence.group("indent"), fence.group("fence")
            info = fence.group("info").strip()
            end = i + 1
            closing = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
            while end < len(lines) and not closing.match(lines[end]):
                end += 1
            body_lines = [b[len(indent) :] if b.startswith(indent) else b.lstrip() for b in lines[i + 1 : end]]
            example = Example(path, i + 1, info.split()[0].lower() if info else "", "\n".join(body_lines) + "\n")
            example.errors.extend(pending_errors)
            for directive in pending:
                _apply(example, directive)
            examples.append(example)
            pending, pending_errors = [], []
            i = end + 1
            continue
        if line.strip() and pending:
            pending_errors.append(f"line {i + 1}: text between an example mark and its block")
            pending = []
        i += 1
    return examples


def command_lines(code: str) -> list[str]:
    """The commands of a shell block: comments and blank lines dropped, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for raw in joined.split("\n"):
        text = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if text:
            out.append(" ".join(text.split()))
    return out


class ExampleFailed(AssertionError):
    """An example exited non-zero, stopped its terminal, or did not finish in time."""


class Shell:
    """One terminal: a ``bash -euo pipefail`` reading the blocks from its standard input.

    Args:
        name: for messages.
        cwd: where it starts.
        env: its environment.
        logs: a directory for its output and the files it runs.
    """

    def __init__(self, name: str, cwd: Path, env: dict[str, str], logs: Path) -> None:
        self.name = name
        self._logs = logs
        self._log = logs / f"shell-{name}.log"
        self._out = open(self._log, "wb")  # noqa: SIM115  (closed in close())
        self._proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-euo", "pipefail"],
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group, for Ctrl-C
        )
        self._count = 0
        self.busy = False  # a block left running in the foreground

    def output_since(self, offset: int) -> str:
        return self._log.read_bytes()[offset:].decode(errors="replace")

    def _send(self, text: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(text.encode())
        self._proc.stdin.flush()

    def _script(self, example: Example) -> str:
        self._count += 1
        if example.lang in PYTHON_LANGS:
            source = self._logs / f"{self.name}-{self._count}.py"
            source.write_text(example.code)
            return example.setup + f"python {source}\n"
        return example.setup + example.code

    def run(self, example: Example, timeout: float) -> str:
        """Run one block to its end; its output. Raises :class:`ExampleFailed`."""
        if self.busy:
            raise ExampleFailed(f"{example.where}: shell {self.name!r} is still running the previous block")
        offset = self._log.stat().st_size
        done = self._logs / f"{self.name}-{self._count + 1}.done"
        self._send(self._script(example) + f"\ntouch {done}\n")
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self._proc.poll() is not None:
                raise ExampleFailed(
                    f"{example.where} failed (exit {self._proc.returncode}):\n{self.output_since(offset)}"
                )
            if time.monotonic() > deadline:
                raise ExampleFailed(f"{example.where} did not finish in {timeout:g} s:\n{self.output_since(offset)}")
            time.sleep(0.05)
        return self.output_since(offset)

    def start(self, example: Example, until: str, timeout: float) -> str:
        """Start a block that keeps running; return once its output shows ``until``."""
        offset = self._log.stat().st_size
        self._send(self._script(example) + "\n")
        self.busy = True
        deadline = time.monotonic() + timeout
        while until not in self.output_since(offset):
            if self._proc.poll() is not None:
                raise ExampleFailed(
                    f"{example.where} ended (exit {self._proc.returncode}) before printing {until!r}:\n"
                    f"{self.output_since(offset)}"
                )
            if time.monotonic() > deadline:
                raise ExampleFailed(f"{example.where} did not print {until!r} in {timeout:g} s")
            time.sleep(0.1)
        return self.output_since(offset)

    def close(self, timeout: float = 60.0) -> int | None:
        """Ctrl-C whatever still runs, end the shell; its exit status (``None``: it had to be killed)."""
        try:
            if self.busy and self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGINT)
            if self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                except BrokenPipeError:
                    pass
            try:
                return self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
                return None
        finally:
            self._out.close()
