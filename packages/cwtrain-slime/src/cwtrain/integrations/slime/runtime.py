"""The slime plug-in's process state: one :class:`SlimeRuntime`, created once per process.

slime loads the plug-in's entry points by name and calls them as plain functions
(``hook``, ``actor_hook``, ``generate_rollout``), so whatever must outlive one call lives in
one object that those functions resolve with :meth:`SlimeRuntime.current` and pass on:

* the run's :class:`~cwtrain.integrations.slime.publisher.SlimePublisher` (the served
  identity and the served copy of the weights), built from the environment on first use;
* the publishing actor's client (``actor_hook``, ``drain``);
* the stamp of the default run id (taken once, so every call of one run agrees);
* the trainer's tokenizer and the rollout samplers (their connection pools outlive a step).

::

    from cwtrain.integrations.slime import SlimePublisher, SlimeRuntime, reset

    SlimeRuntime.current().use_publisher(SlimePublisher(config, loader=my_loader))  # a custom loader
    SlimeRuntime.current().set_tokenizer(tokenizer)                                 # prompts as its ids
    reset()                                                                         # a new run

Nothing else in the plug-in keeps process-wide state; :func:`reset` starts this one object
over (closing the publisher and the samplers).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from .actor import ActorPublishClient
from .config import HookConfig, run_id_from
from .publisher import SlimePublisher

if TYPE_CHECKING:
    from cwtrain.hotload import PublishSession
    from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig

__all__ = ["PromptTokenizer", "SlimeRuntime", "default_run_id", "reset"]

log = logging.getLogger(__name__)


class PromptTokenizer(Protocol):
    """The trainer's tokenizer as the rollout function uses it (a HuggingFace tokenizer fits)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Token ids of ``text`` (called with ``add_special_tokens=False``)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` (the sampler's text fallback)."""
        ...


class SlimeRuntime:
    """Everything the slime plug-in keeps for the life of a process (see the module docstring).

    Thread-safe: slime may call the hook and the rollout function from different threads.
    The plug-in's entry points use the process's one instance, :meth:`current`.
    """

    @classmethod
    def current(cls) -> SlimeRuntime:
        """The process's one runtime."""
        return _CURRENT

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._run_stamp: str | None = None
        self._publisher: SlimePublisher | None = None
        self._actor_client: ActorPublishClient | None = None
        self._tokenizer: PromptTokenizer | None = None
        self._tokenizer_loaded = False
        self._samplers: dict[tuple[RolloutConfig, int, int], CompletionSampler] = {}
        self._session: PublishSession | None = None

    # ------------------------------------------------------------------ run identity

    def default_run_id(self, args: argparse.Namespace | None = None) -> str:
        """The run id when ``CWTRAIN_HOTLOAD_RUN_ID`` is unset (see :func:`default_run_id`)."""
        with self._lock:
            if self._run_stamp is None:
                self._run_stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            stamp = self._run_stamp
        return run_id_from(args, stamp)

    def hook_config(self, args: argparse.Namespace) -> HookConfig:
        """The hook's settings from the environment, with this run's default id and state directory."""
        return HookConfig.from_env(default_run_id=self.default_run_id(args)).with_state_dir(args)

    # ------------------------------------------------------------------ publishing

    def publisher(self, args: argparse.Namespace) -> SlimePublisher:
        """The run's publisher, built from the environment and ``args`` on first use."""
        with self._lock:
            if self._publisher is None:
                config = self.hook_config(args)
                log.info(
                    "publishing weight versions to deployment %s as %s-vNNNNNN", config.deployment_id, config.run_id
                )
                self._publisher = SlimePublisher(config)
            return self._publisher

    def use_publisher(self, publisher: SlimePublisher | None) -> None:
        """Make the hook use ``publisher`` (a custom loader, tests); ``None`` forgets the current one."""
        with self._lock:
            self._publisher = publisher

    def note_session(self, session: PublishSession | None) -> None:
        """The publish session of a publisher the runtime did not build (the live-tensor path's rank 0)."""
        with self._lock:
            self._session = session

    def publishing_session(self) -> PublishSession | None:
        """The publish session this process holds (rank 0's), if it built one: the sample canary refuses through it."""
        with self._lock:
            if self._publisher is not None:
                return self._publisher.session
            return self._session

    def actor_client(self, args: argparse.Namespace) -> ActorPublishClient:
        """This process's handle on the publishing actor, created (with the actor) on first use."""
        with self._lock:
            if self._actor_client is None:
                self._actor_client = ActorPublishClient(self.hook_config(args))
            return self._actor_client

    @property
    def current_actor_client(self) -> ActorPublishClient | None:
        """The actor client if this process created one (``drain`` waits on it)."""
        with self._lock:
            return self._actor_client

    # ------------------------------------------------------------------ rollouts

    def set_tokenizer(self, tokenizer: PromptTokenizer | None) -> None:
        """Use ``tokenizer`` for prompts; ``None`` sends prompts as text (the endpoint's ids are used)."""
        with self._lock:
            self._tokenizer, self._tokenizer_loaded = tokenizer, True
            self._samplers.clear()  # built for the previous tokenizer; whoever holds one keeps it

    def tokenizer(self, args: argparse.Namespace) -> PromptTokenizer | None:
        """The tokenizer for prompts: the one set, else ``--hf-checkpoint``'s (loaded once), else ``None``."""
        with self._lock:
            if not self._tokenizer_loaded:
                self._tokenizer_loaded = True
                self._tokenizer = _load_tokenizer(args)
            return self._tokenizer

    def sampler(self, config: RolloutConfig, tokenizer: PromptTokenizer | None, group_size: int) -> CompletionSampler:
        """One sampler per configuration, tokenizer and group size for the process."""
        from cwtrain.integrations.rollout import CompletionSampler

        key = (config, id(tokenizer), group_size)
        with self._lock:
            sampler = self._samplers.get(key)
            if sampler is None:
                sampler = self._samplers[key] = CompletionSampler(config, tokenizer=tokenizer, group_size=group_size)
            return sampler

    # ------------------------------------------------------------------ reset

    def reset(self) -> None:
        """Start over: close the publisher and the samplers, forget the actor client, stamp and tokenizer.

        The publishing actor itself (a named Ray actor) is left alone.
        """
        with self._lock:
            publisher, self._publisher = self._publisher, None
            samplers = list(self._samplers.values())
            self._samplers.clear()
            self._actor_client = None
            self._session = None
            self._run_stamp = None
            self._tokenizer, self._tokenizer_loaded = None, False
        if publisher is not None:
            publisher.close()
        _close_all(samplers)


def _load_tokenizer(args: argparse.Namespace) -> PromptTokenizer | None:
    hf_checkpoint = getattr(args, "hf_checkpoint", None)
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]

        tokenizer: PromptTokenizer = AutoTokenizer.from_pretrained(hf_checkpoint, trust_remote_code=True)
    except Exception as exc:
        log.warning(
            "no tokenizer from --hf-checkpoint %s (%s): prompts are sent as text and the endpoint's "
            "prompt token ids are trained on",
            hf_checkpoint,
            exc,
        )
        return None
    return tokenizer


def _close_all(samplers: list[CompletionSampler]) -> None:
    for sampler in samplers:
        try:
            sampler.close()
        except Exception:  # closing is best effort
            log.debug("closing a sampler failed", exc_info=True)


_CURRENT = SlimeRuntime()


def reset() -> None:
    """Forget the run's publisher, actor client, default run id, tokenizer and samplers (a new run, tests)."""
    _CURRENT.reset()


def default_run_id(args: argparse.Namespace | None = None) -> str:
    """The run id used when ``CWTRAIN_HOTLOAD_RUN_ID`` is unset: :func:`~.config.run_id_from` ``args``.

    Without a wandb run id its stamp is taken once per process (until :func:`reset`), so every
    call in one process agrees, but the rollout manager cannot know it: set
    ``CWTRAIN_HOTLOAD_RUN_ID`` (the recipes do) or log to wandb, and a resumed run keeps its
    identities too.
    """
    return _CURRENT.default_run_id(args)
