"""Helpers of the NeMo-RL and NeMo Gym real-code contract suite (``scripts/contracts-nemo.sh``).

The suite runs cwtrain's entry points against the real code wherever it is found, and skips
with the reason otherwise:

* ``CWTRAIN_NEMO_RL_SRC``: a NeMo-RL v0.7.0 tree with its Automodel submodule, importable by
  the interpreter running pytest (NeMo-RL's dependencies installed there). The suite never
  imports it from there: :func:`patched_nemo_rl` copies it and applies cwtrain's patch in
  place, as the recipe's ``launch.sh`` does to ``/opt/nemo-rl``.
* ``CWTRAIN_GYM_VENV``: a virtual environment with NeMo Gym installed (``bin/gym``), driven
  through its command line; its servers run in it (:func:`gym_server_venvs`).
* ``CWTRAIN_NEMO_GYM_PYTHON``: an interpreter with NeMo-RL's dependencies *and* NeMo Gym, the
  ``NemoGym`` actor's environment (the image prebuilds it as NeMo-RL's ``NEMO_GYM`` venv).

Other helpers: :func:`write_tiny_tokenizer` (a HuggingFace tokenizer with a chat template
for cwtrain-local's tiny model, the same ids), :func:`local_chat_served` (whether the local
stack serves ``/v1/chat/completions`` yet).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GYM_ENV_ROOT = HERE / "gym_env"
RUN_WITH = "scripts/contracts-nemo.sh"
CWTRAIN_SRCS = [
    ROOT / "packages" / p / "src" for p in ("cwtrain-core", "cwtrain-local", "cwtrain-nemo-rl", "cwtrain-gym")
]
UPSTREAM_DTENSOR = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
UPSTREAM_NEMO_GYM = "nemo_rl.environments.nemo_gym.NemoGym"
#: The chat template of the tiny tokenizer: ``<role initial>:<content><eos>`` per message.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'][0] + ':' + (message['content'] or '') + '<eos>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'a:' }}{% endif %}"
)


#: The suite's variables as they were when it started (the slime/miles fixtures of this folder's
#: conftest clear CWTRAIN_* variables before every test).
VARIABLES = {
    name: os.environ.get(name) for name in ("CWTRAIN_NEMO_RL_SRC", "CWTRAIN_GYM_VENV", "CWTRAIN_NEMO_GYM_PYTHON")
}


def variable(name: str, what: str) -> str:
    """The value of ``name`` (when the suite started), or skip the test saying what it should point at."""
    value = VARIABLES.get(name) or os.environ.get(name)
    if not value:
        pytest.skip(f"{name} is not set: point it at {what} (or run {RUN_WITH})")
    return value


def nemo_rl_src() -> Path:
    """The NeMo-RL v0.7.0 source tree (``CWTRAIN_NEMO_RL_SRC``)."""
    src = Path(variable("CWTRAIN_NEMO_RL_SRC", "a NeMo-RL v0.7.0 checkout with its Automodel submodule"))
    if not (src / "nemo_rl" / "algorithms" / "grpo.py").is_file():
        pytest.skip(f"CWTRAIN_NEMO_RL_SRC={src} holds no nemo_rl/algorithms/grpo.py")
    return src


def gym_venv() -> Path:
    """A virtual environment with NeMo Gym's ``gym`` command (``CWTRAIN_GYM_VENV``)."""
    venv = Path(variable("CWTRAIN_GYM_VENV", "a virtual environment with nemo-gym installed"))
    if not (venv / "bin" / "gym").is_file():
        pytest.skip(f"CWTRAIN_GYM_VENV={venv} has no bin/gym")
    return venv


def gym_version(venv: Path) -> str:
    """The NeMo Gym version installed in ``venv``."""
    code = "from importlib.metadata import version; print(version('nemo-gym'))"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def gym_install_root(venv: Path) -> Path:
    """Where ``venv``'s Gym keeps its built-in configs (beside the ``nemo_gym`` package)."""
    code = "import os, nemo_gym; print(os.path.dirname(os.path.dirname(os.path.abspath(nemo_gym.__file__))))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def pythonpath(*extra: Path | str) -> str:
    """``PYTHONPATH`` for child processes: ``extra`` first, then cwtrain's package sources."""
    return os.pathsep.join(str(p) for p in [*extra, *CWTRAIN_SRCS])


def patched_nemo_rl(target: Path) -> Path:
    """A copy of the NeMo-RL tree at ``target`` with cwtrain's patch applied in place by its helper.

    As ``launch.sh`` does to the image's ``/opt/nemo-rl``: the whole tree stays (``3rdparty/``,
    ``pyproject.toml``), so NeMo-RL's environment lookup, which starts from where ``nemo_rl``
    is imported, still finds its project and prebuilt environments.
    """
    src = nemo_rl_src()
    if not target.exists():
        shutil.copytree(src, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    env = {**os.environ, "PYTHONPATH": pythonpath(target)}
    done = subprocess.run(
        [sys.executable, "-m", "cwtrain.integrations.nemo_rl.patch", "--root", str(target)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("applied", "already applied")
    return target


def nemo_rl_paths(tree: Path) -> list[Path]:
    """What must be importable for NeMo-RL from ``tree``: the tree and its Automodel submodule."""
    return [tree, tree / "3rdparty" / "Automodel-workspace" / "Automodel"]


def venv_of(python: str | Path) -> Path:
    """The virtual environment an interpreter path belongs to (skip when it is none)."""
    venv = Path(python).parent.parent  # not resolved: a venv's bin/python links to the base interpreter
    if not (venv / "pyvenv.cfg").is_file():
        pytest.skip(f"{python} is not a virtual environment's interpreter")
    return venv


def prebuilt_venv(venv_dir: Path, fqn: str, venv: Path) -> Path:
    """An image-style prebuilt environment ``<venv_dir>/<fqn>`` (a link to ``venv``); returns its python."""
    link = venv_dir / fqn
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(venv, target_is_directory=True)
    return link / "bin" / "python"


def gym_server_venvs(root: Path, venv: Path, servers: Iterable[str]) -> Path:
    """Gym's per-server environments (``<root>/<type>/<name>/.venv``) as links to ``venv``.

    With ``uv_venv_dir: root`` and ``skip_venv_if_present: true`` Gym runs each server there
    instead of building an environment from the package index.
    """
    for server in servers:
        target = root / server / ".venv"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(venv, target_is_directory=True)
    return root


def write_tiny_tokenizer(directory: Path) -> None:
    """A HuggingFace tokenizer for cwtrain-local's tiny model: its character ids, ``<eos>`` = 0,
    and :data:`TINY_CHAT_TEMPLATE`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from cwtrain.local.engine.model import Tokenizer as TinyTokenizer

    tiny = TinyTokenizer()
    inner = Tokenizer(models.WordLevel(vocab={tok: i for i, tok in enumerate(tiny.tokens)}, unk_token="?"))
    inner.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    inner.decoder = decoders.Fuse()
    inner.add_special_tokens(["<eos>", "<bos>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=inner, eos_token="<eos>", bos_token="<bos>", pad_token="<eos>", unk_token="?"
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(str(directory))


def local_chat_served(base_url: str, model: str, key: str) -> bool:
    """Whether the local stack's gateway serves ``/v1/chat/completions`` (another change adds it)."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    response = httpx.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=60)  # fmt: skip
    return response.status_code == 200
