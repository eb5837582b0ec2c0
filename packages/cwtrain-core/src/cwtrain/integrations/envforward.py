"""Which environment variables reach framework workers, and which values are secret.

Ray workers and job pods do not inherit the launcher's environment; the launchers and the
publishing actor hand the variables cwtrain reads to them in Ray's ``runtime_env`` (never on
a command line, where every process could read them), and anything logged goes through
:func:`redacted_env` first::

    from cwtrain.integrations.envforward import forwarded_env, redacted_env

    ray.remote(Worker).options(runtime_env={"env_vars": forwarded_env(extra=["MY_VAR"])})
    log.info("environment: %s", redacted_env(forwarded_env()))

* :func:`forwarded_env` - every set ``CWTRAIN_*``, ``COREWEAVE_*``, ``CW_*``, ``AWS_*`` and
  ``HF_*`` variable (:data:`FORWARDED_PREFIXES`), plus named extras.
* :func:`is_secret_env_var` - whether a variable's value must never be printed: declared
  cwtrain variables say so themselves (:data:`cwtrain.config.VARIABLES`), other names are
  judged by words such as TOKEN, SECRET, PASSWORD, KEY or CREDENTIAL.
* :func:`redacted_env` - a copy with every secret value replaced by ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from cwtrain.config import VARIABLES

__all__ = ["FORWARDED_PREFIXES", "forwarded_env", "is_secret_env_var", "redacted_env"]

FORWARDED_PREFIXES = ("CWTRAIN_", "COREWEAVE_", "CW_", "AWS_", "HF_")
_SECRET_WORDS = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE|AUTH)", re.I)


def is_secret_env_var(name: str) -> bool:
    """Whether the value of variable ``name`` is a secret (never logged, printed or put on a command line).

    Declared cwtrain variables say so themselves (``COREWEAVE_API_TOKEN``, ``CWTRAIN_API_HEADERS``,
    ...); any other name is judged by words such as TOKEN, SECRET, PASSWORD, KEY or CREDENTIAL.
    """
    declared = VARIABLES.get(name)
    if declared is not None and declared.secret:
        return True
    if name == "AWS_ACCESS_KEY_ID":
        return True
    return bool(_SECRET_WORDS.search(name))


def forwarded_env(environ: Mapping[str, str] | None = None, *, extra: Sequence[str] = ()) -> dict[str, str]:
    """The variables a launcher hands to Ray workers: every ``CWTRAIN_*``, ``COREWEAVE_*``,
    ``CW_*``, ``AWS_*`` and ``HF_*`` variable that is set, plus the names in ``extra``.

    Pass the result through Ray's ``runtime_env={"env_vars": ...}`` (or the job's
    environment), never on a command line, where secrets would be visible to every process.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if (k.startswith(FORWARDED_PREFIXES) or k in extra) and v != ""}


def redacted_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with every secret value replaced by ``***`` (for logs)."""
    return {k: ("***" if is_secret_env_var(k) else v) for k, v in environ.items()}
