"""Driver of the NeMo-RL recipe: NeMo-RL v0.7.0 GRPO with cwtrain's ``coreweave`` backend.

``launch.sh`` runs it on the Ray head after ``python -m cwtrain.integrations.nemo_rl.patch``
patched NeMo-RL in place::

    python run_grpo_coreweave.py --config grpo-coreweave.yaml [hydra overrides ...]

Before NeMo-RL's own script runs (unchanged, through :mod:`runpy`),
:func:`cwtrain.integrations.nemo_rl.install` registers cwtrain's policy worker
(``CWTRAIN_POLICY_WORKER``, default the DTensor worker) with the prebuilt environment of the
NeMo-RL worker it extends, wraps ``grpo.setup`` so the policy is built with that worker, the
generation gets a ``HotLoadWeightSynchronizer`` seeded from ``policy.model_name`` and the run's
logger writes the ``hotload/*`` metrics, and rebinds ``grpo.refit_policy_generation`` so a
``CoreWeaveGeneration`` syncs weights by hot-load. The script is ``examples/run_grpo.py``, or
``examples/nemo_gym/run_grpo_nemo_gym.py`` when the configuration sets
``env.should_use_nemo_gym: true`` (NeMo Gym environments; it binds the Gym actor as the
``nemo_gym`` task's environment).

``defaults:`` may name a file of NeMo-RL's checkout relative to it (``NEMO_RL_DIR``, default
``/opt/nemo-rl``), as ``grpo-coreweave.yaml`` does: NeMo-RL v0.7.0 reads an absolute entry as
is and a relative one from the config file's own directory
(``nemo_rl.utils.config.load_config_with_inheritance``), so an entry that is no file beside
the config is looked up under ``NEMO_RL_DIR``, and NeMo-RL is given a copy of the config with
that entry made absolute (:func:`resolve_defaults`). A NeMo-RL anywhere works with the same
file.
"""

from __future__ import annotations

import os
import runpy
import sys


def _config_argument(argv: list[str]) -> tuple[int, str] | None:
    """Where ``--config PATH`` (or ``--config=PATH``) is in ``argv``, and the path."""
    for at, arg in enumerate(argv):
        if arg == "--config" and at + 1 < len(argv):
            return at + 1, argv[at + 1]
        if arg.startswith("--config="):
            return at, arg.split("=", 1)[1]
    return None


def resolve_defaults(argv: list[str], nemo_rl_dir: str) -> list[str]:
    """``argv`` with ``--config`` naming a copy whose relative ``defaults:`` entries NeMo-RL finds.

    An entry that is absolute, or a file beside the config (NeMo-RL's own rule), stays; any
    other relative entry becomes ``NEMO_RL_DIR/<entry>``. ``argv`` is returned unchanged when
    nothing changes.

    Raises:
        FileNotFoundError: an entry is neither beside the config nor under ``nemo_rl_dir``.
    """
    import tempfile

    import yaml

    found = _config_argument(argv)
    if found is None:
        return argv
    index, path = found
    config_file = os.path.abspath(path)
    with open(config_file, encoding="utf-8") as stream:
        config = yaml.safe_load(stream)
    if not isinstance(config, dict) or "defaults" not in config:
        return argv
    entries = config["defaults"] if isinstance(config["defaults"], list) else [config["defaults"]]
    resolved = []
    for entry in map(str, entries):
        beside = os.path.join(os.path.dirname(config_file), entry)
        if os.path.isabs(entry) or os.path.exists(beside):
            resolved.append(entry)
            continue
        checkout = os.path.join(nemo_rl_dir, entry)
        if not os.path.exists(checkout):
            raise FileNotFoundError(
                f"{config_file}: defaults entry {entry!r} is neither beside it nor in NeMo-RL's checkout "
                f"({checkout}); set NEMO_RL_DIR to the directory NeMo-RL runs from"
            )
        resolved.append(checkout)
    if resolved == list(map(str, entries)):
        return argv
    config["defaults"] = resolved if isinstance(config["defaults"], list) else resolved[0]
    copy = os.path.join(tempfile.mkdtemp(prefix="cwtrain-grpo-config-"), os.path.basename(config_file))
    with open(copy, "w", encoding="utf-8") as stream:
        yaml.safe_dump(config, stream, sort_keys=False)
    out = list(argv)
    out[index] = copy if out[index] == path else f"--config={copy}"
    return out


def uses_nemo_gym(argv: list[str]) -> bool:
    """Whether the configuration (``--config`` plus Hydra overrides, as NeMo-RL loads them) enables NeMo Gym."""
    from nemo_rl.utils.config import load_config, parse_hydra_overrides
    from omegaconf import OmegaConf

    args = list(argv)
    path = None
    if "--config" in args:
        at = args.index("--config")
        path = args[at + 1]
        del args[at : at + 2]
    else:
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
        args = [a for a in args if not a.startswith("--config=")]
    if path is None:
        return False
    config = load_config(path)
    if args:
        config = parse_hydra_overrides(config, args)
    return bool(OmegaConf.select(config, "env.should_use_nemo_gym", default=False))


def main() -> None:
    """Install cwtrain's rebindings, then run NeMo-RL's GRPO script with this process's arguments."""
    from cwtrain.integrations.nemo_rl import DTENSOR_WORKER_FQN, install

    install(os.environ.get("CWTRAIN_POLICY_WORKER") or DTENSOR_WORKER_FQN)
    nemo_rl_dir = os.environ.get("NEMO_RL_DIR", "/opt/nemo-rl")
    examples = os.path.join(nemo_rl_dir, "examples")
    argv = resolve_defaults(sys.argv[1:], nemo_rl_dir)
    gym = uses_nemo_gym(argv)
    script = (
        os.path.join(examples, "nemo_gym", "run_grpo_nemo_gym.py") if gym else os.path.join(examples, "run_grpo.py")
    )
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
