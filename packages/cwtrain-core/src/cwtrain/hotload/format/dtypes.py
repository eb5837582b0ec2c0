"""The dtype a FULL snapshot is served in (snapshot-format.md 3.1): one rule, and its warning.

A FULL snapshot replaces every weight in place, so its tensors should be in the dtype the
model is served in, which its ``config.json`` declares (``torch_dtype``). In-memory tensors
(:func:`~cwtrain.hotload.store.snapshot_checks.check_published_tensors`) and a FULL directory
(:func:`~cwtrain.hotload.files.validate.inspect_snapshot`) are held to the same rule, before
anything is uploaded::

    check_declared_dtype({"lm_head.weight": "F32"}, {"torch_dtype": "bfloat16"})
    # DtypeWarning: 1 of 1 tensors are F32 ('lm_head.weight') but config.json declares torch_dtype 'bfloat16': ...
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from cwtrain.hotload.format.safetensors import safetensors_dtype

__all__ = ["DtypeWarning", "check_declared_dtype"]


class DtypeWarning(UserWarning):
    """Tensors of a FULL snapshot in another dtype than the one ``config.json`` says the model is served in.

    A warning, not an error: some checkpoints keep a few tensors wider on purpose.
    ``warnings.simplefilter("error", DtypeWarning)`` makes it one.
    """


#: The floating-point dtypes compared with ``config.json``'s ``torch_dtype`` (8-bit and
#: narrower ones are quantized weights, which keep their own dtype by design).
_WIDE_FLOATS = frozenset({"F16", "BF16", "F32", "F64"})
#: Warnings point at the first caller outside ``cwtrain.hotload``.
_HOTLOAD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_declared_dtype(dtypes: Mapping[str, str | None], config: Mapping[str, Any], *, source: str = "") -> None:
    """The one dtype rule of a FULL snapshot: tensors in another dtype than ``config.json`` declares.

    Its F16/BF16/F32/F64 tensors whose dtype is not ``config.json``'s ``torch_dtype`` (or
    ``dtype``) give one :class:`DtypeWarning` naming the served dtype; not with a
    ``quantization_config`` (mixed dtypes by design), nor without a declared dtype. The
    in-memory path (:func:`~cwtrain.hotload.store.snapshot_checks.check_published_tensors`) and a FULL directory
    (:func:`~cwtrain.hotload.files.validate.inspect_snapshot`, so ``cwtrain hotload publish``
    and ``inspect``) both apply it, before anything is uploaded.

    Args:
        dtypes: every tensor's safetensors dtype (``None`` when unknown).
        config: the snapshot's ``config.json`` object.
        source: where the tensors are (a directory), named first in the warning.
    """
    declared = config.get("torch_dtype", config.get("dtype"))
    served = safetensors_dtype(declared) if isinstance(declared, str) else None
    if served is None or "quantization_config" in config:
        return
    others = [name for name, dtype in dtypes.items() if dtype in _WIDE_FLOATS and dtype != served]
    if others:
        found = sorted({str(dtypes[n]) for n in others})
        warnings.warn(
            DtypeWarning(
                f"{source + ': ' if source else ''}{len(others)} of {len(dtypes)} tensors are {'/'.join(found)} "
                f"({_listed(others)}) but config.json declares torch_dtype {declared!r}: the model is served in "
                f"{served}. Publish {served} tensors "
                f"(numpy has no bfloat16: TensorData('BF16', shape, raw_bytes) or torch.bfloat16)"
            ),
            skip_file_prefixes=(_HOTLOAD_DIR,),
        )
