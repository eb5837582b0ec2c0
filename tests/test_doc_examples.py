"""Every shell and Python example in the docs runs, as written, against the local stack.

The docs are ``README.md``, ``packages/*/README.md`` and ``docs/*.md``. Every fenced block
whose info string is ``bash``, ``sh``, ``shell``, ``python`` or ``py`` is an example; blocks
of data or output say so (``text``, ``json``, ``yaml``, ...; see ``tests/_doc_examples.py``).
The examples of one file run in order, in one terminal (a ``bash -euo pipefail`` fed each
block in turn, so variables, ``cd`` and ``source`` carry over; a Python block runs there as
``python FILE``), from a scratch copy of the checkout, with ``.venv-3.12`` standing for the
environment the tests run in. Unless the file is marked otherwise, the terminal starts with
the environment ``eval "$(cwtrain local env)"`` gives: a local stack (the session's shared
one, a fresh bucket) with a READY two-replica hot-load deployment of the tiny model, and
this environment's ``bin`` on ``PATH``. A block that exits non-zero fails the test.

Marks, as HTML comments on the lines right above a block (invisible on the rendered page)::

    <!-- example: skip KIND: REASON -->     not run; KIND is one of
                                            cluster   needs a CoreWeave account or the real service
                                            gpu       needs a CUDA device
                                            framework needs slime/miles/NeMo-RL/NeMo Gym's environment
                                            ci        runs elsewhere; REASON names the file that runs it
                                                      (with .ci/run, its commands must appear there)
                                            install   installs packages; every line must be a path
                                                      install (tests/test_docs_install.py)
    <!-- example: setup                     hidden shell lines run just before the block (make the
    cwtrain local base-checkpoint --out c   files it names, set a variable it reads)
    -->
    <!-- example: shell NAME -->            run it in another terminal (its own variables and cwd)
    <!-- example: background until TEXT --> leave it running once its output shows TEXT (a server
                                            in the foreground of its terminal); Ctrl-C at the end

and, anywhere in a file:

    <!-- examples: own local stack -->       its terminals start with no local stack and no
                                            environment on ``PATH`` (the file starts its own, as
                                            ``docs/quickstart-local.md`` does)
    <!-- examples: environment PROFILE -->  it runs in the environment PROFILE sets up (``core``,
                                            ``demo``; ``scripts/profile_requirements.py``): a view
                                            of the test environment holding only that profile's
                                            packages and what they require (``tests/_env_view.py``)
                                            stands for ``.venv-3.12`` and its ``bin`` for the one
                                            on ``PATH``, so an import the profile lacks fails
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _doc_examples import (
    DATA_LANGS,
    ENVIRONMENT,
    OWN_STACK,
    PYTHON_LANGS,
    SHELL_LANGS,
    Example,
    Shell,
    command_lines,
    parse,
)
from _env_view import PROFILES, make_view
from test_docs_install import bad_install_lines

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/*.md")])
EXAMPLES = {path: parse(path) for path in DOCS}
RUNNABLE = [path for path, examples in EXAMPLES.items() if any(e.runnable for e in examples)]
#: Seconds one block may take.
BLOCK_TIMEOUT = 240.0
_INSTALL = re.compile(r"^(?:python3? -m )?pip3? install ")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _problems(example: Example) -> list[str]:
    problems = list(example.errors)
    if example.lang not in SHELL_LANGS | PYTHON_LANGS | DATA_LANGS | {""}:
        problems.append(f"info string {example.lang!r} is neither an example language nor a data one")
    if example.lang in DATA_LANGS | {""} and (example.skip or example.setup or example.background_until):
        problems.append("example marks on a block that is not an example")
    if example.background_until and example.lang not in SHELL_LANGS:
        problems.append("only a shell block can be left running in the background")
    if example.skip is None:
        if example.lang in SHELL_LANGS and any(_INSTALL.match(cmd) for cmd in command_lines(example.code)):
            problems.append("installs packages: put install lines in a block of their own marked 'skip install'")
        return problems
    kind, reason = example.skip
    if kind == "ci":
        named = [w.lstrip("`'\"(").rstrip("`'\".,;:)") for w in reason.split()]
        files = [w for w in named if "/" in w or w.startswith(".")]
        existing = [w for w in files if (ROOT / w).exists()]
        if not existing:
            problems.append(f"a 'skip ci' reason must name the file that runs it (found none of {files})")
        if ".ci/run" in existing:
            ci = " ".join((ROOT / ".ci/run").read_text().split())
            problems += [f"'{cmd}' is not in .ci/run" for cmd in command_lines(example.code) if cmd not in ci]
    if kind == "install":
        problems += [f"not an install line: '{cmd}'" for cmd in command_lines(example.code) if not _INSTALL.match(cmd)]
        problems += [f"installs cwtrain from an index: {line}" for line in bad_install_lines(example.code)]
    return problems


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_every_example_is_run_or_marked_with_a_reason(path: Path) -> None:
    problems = [f"{e.where}: {p}" for e in EXAMPLES[path] for p in _problems(e)]
    profile = _environment(path)
    if profile is not None and profile not in PROFILES:
        problems.append(f"environment {profile!r} is none of {sorted(PROFILES)}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ running them


def _environment(path: Path) -> str | None:
    """The profile a doc names with ``<!-- examples: environment PROFILE -->``, if any."""
    found = ENVIRONMENT.findall(path.read_text(encoding="utf-8"))
    assert len(found) <= 1, f"{_rel(path)} names more than one environment: {found}"
    return found[0] if found else None


@pytest.fixture(scope="session")
def environment_views(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str | None, Path]]:
    """Each profile's view of this environment (its prefix), made once; None: this environment."""
    views: dict[str | None, Path] = {None: Path(sys.prefix)}
    root = tmp_path_factory.mktemp("environments")
    for profile in sorted({p for p in map(_environment, RUNNABLE) if p is not None}):
        make_view(profile, root / profile)
        views[profile] = root / profile
    yield views


def _scratch_checkout(where: Path, prefix: Path) -> Path:
    """A directory that looks like the checkout (links to its files), its own for writing."""
    where.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith((".venv", ".mypy_cache", ".pytest_cache", ".git")):
            (where / entry.name).symlink_to(entry)
    (where / ".venv-3.12").symlink_to(prefix)  # the environment the doc names (by default, this one)
    return where


def _base_env(tmp: Path, prefix: Path, *, with_venv: bool) -> dict[str, str]:
    drop = ("COREWEAVE_", "CW_", "CWTRAIN_", "AWS_", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    ours = {str(Path(sys.executable).parent), str(prefix / "bin")}
    path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and p not in ours]
    env["PATH"] = os.pathsep.join(([str(prefix / "bin")] if with_venv else []) + path)
    for name in ("cache", "tmp"):
        (tmp / name).mkdir()
    env.update(XDG_CACHE_HOME=str(tmp / "cache"), TMPDIR=str(tmp / "tmp"), PYTHONDONTWRITEBYTECODE="1")
    env["PIP_DRY_RUN"] = "1"  # an install that slipped through must not change the environment the tests run in
    return env


@pytest.fixture
def local_env(
    request: pytest.FixtureRequest, tmp_path: Path, environment_views: dict[str | None, Path]
) -> Iterator[dict[str, str]]:
    """The terminal's starting environment: with a deployed local stack unless the doc starts its own."""
    path: Path = request.param
    prefix = environment_views[_environment(path)]
    if OWN_STACK in path.read_text(encoding="utf-8"):
        yield _base_env(tmp_path, prefix, with_venv=False)
        return
    shared: Any = request.getfixturevalue("shared_stack")
    with shared.view(f"docs-{path.stem}") as stack:
        target = stack.deploy()
        env = _base_env(tmp_path, prefix, with_venv=True) | stack.env()
        env.update(
            CWTRAIN_HOTLOAD_DEPLOYMENT_ID=target.deployment_id,
            CWTRAIN_ROLLOUT_BASE_URL=target.base_url,
            CWTRAIN_ROLLOUT_MODEL=target.model,
            CWTRAIN_ROLLOUT_API_KEY=stack.token,
        )
        yield env


def run_doc(path: Path, env: dict[str, str], tmp: Path, prefix: Path) -> dict[str, list[str]]:
    """Run the runnable examples of ``path`` in order, with ``prefix`` as ``.venv-3.12``; each terminal's outputs."""
    checkout = _scratch_checkout(tmp / "checkout", prefix)
    logs = tmp / "logs"
    logs.mkdir()
    shells: dict[str, Shell] = {}
    outputs: dict[str, list[str]] = {}
    failed = True
    try:
        for example in EXAMPLES[path]:
            if not example.runnable:
                continue
            shell = shells.get(example.shell)
            if shell is None:
                shell = shells[example.shell] = Shell(example.shell, checkout, dict(env), logs)
            if example.background_until is not None:
                text = shell.start(example, example.background_until, BLOCK_TIMEOUT)
            else:
                text = shell.run(example, BLOCK_TIMEOUT)
            outputs.setdefault(example.shell, []).append(text)
        failed = False
    finally:
        statuses = {name: shell.close() for name, shell in reversed(shells.items())}
    if not failed:  # a server left running must stop on Ctrl-C, and every terminal end cleanly
        assert all(status == 0 for status in statuses.values()), f"terminals ended with {statuses}: {outputs}"
    return outputs


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("local_env", RUNNABLE, ids=_rel, indirect=True)
def test_the_examples_run(
    local_env: dict[str, str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    environment_views: dict[str | None, Path],
) -> None:
    path: Path = request.node.callspec.params["local_env"]
    run_doc(path, local_env, tmp_path, environment_views[_environment(path)])


# ------------------------------------------------------------ the local quick start

QUICKSTART = ROOT / "docs" / "quickstart-local.md"


def test_the_local_quickstart_keeps_every_step_and_runs_them() -> None:
    """The steps of issue 27's first hour stay in the quick start, as examples that run."""
    examples = [e for e in EXAMPLES[QUICKSTART] if e.lang in SHELL_LANGS | PYTHON_LANGS]
    text = QUICKSTART.read_text(encoding="utf-8")
    assert OWN_STACK in text

    def first(pattern: str, *, last: bool = False) -> Example:
        found = [e for e in examples if re.search(pattern, e.code, re.MULTILINE)]
        assert found, f"the quick start lost its step {pattern!r}"
        return found[-1 if last else 0]

    demo = first(r"^bash scripts/demo\.sh")
    assert demo.skip is not None and demo.skip[0] == "ci"
    up, joined = first(r"cwtrain local up"), first(r'eval "\$\(cwtrain local env\)"')
    steps = [
        up,
        joined,
        first(r"cwtrain local base-checkpoint --out"),
        first(r"view\(np\.uint16\)|\.view\(np\.uint32\)|<u2"),  # a BF16 tensor changed with numpy
        first(r"cwtrain hotload publish .*--base"),
        first(r"from openai import OpenAI", last=True),  # the new weights read back
    ]
    assert all(step.runnable for step in steps), [s.where for s in steps if not s.runnable]
    assert up.background_until and up.shell != joined.shell  # a second terminal joins the first
    assert [s.line for s in steps] == sorted(s.line for s in steps)


def test_the_local_quickstart_lists_the_served_tensors() -> None:
    """The table of the local model's tensors is the model's (names, shapes, BF16)."""
    from cwtrain.local.engine.model import ModelConfig

    rows = re.findall(r"^\| `([^`]+)` \| `\[([0-9, ]+)\]` \| BF16 \|", QUICKSTART.read_text(), re.MULTILINE)
    documented = {name: tuple(int(n) for n in shape.split(",")) for name, shape in rows}
    shapes = ModelConfig().tensor_shapes()
    layer0 = {k: v for k, v in shapes.items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    expected = {k.replace("model.layers.0.", "model.layers.N."): v for k, v in layer0.items()}
    assert documented == expected
