"""What publishing in-memory tensors checks before anything is encoded (issue 27).

:func:`check_published_tensors` runs first in ``SnapshotStore.upload_tensors`` (so in
``HotLoader.publish`` of a mapping too): the dtypes against the served ones (an error for a
delta, which cannot change a dtype; a :class:`DtypeWarning` for a FULL snapshot whose
tensors differ from ``config.json``'s ``torch_dtype``:
:func:`~cwtrain.hotload.format.dtypes.check_declared_dtype`, the rule a FULL directory is held
to as well), and a FULL snapshot's ``config.json``. numpy has no bfloat16: BF16 weights go over as
``TensorData("BF16", shape, raw_bytes)`` (:class:`~cwtrain.hotload.format.tensors.TensorData`)
or as ``torch.bfloat16`` tensors::

    check_published_tensors(new, base=served, extra_files=None, delta=True)
    # SnapshotError: the delta's tensors must keep the served dtypes: 'lm_head.weight' is F32, served as BF16; ...
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.dtypes import DtypeWarning, check_declared_dtype
from cwtrain.hotload.format.safetensors import safetensors_dtype
from cwtrain.hotload.format.tensors import TensorData

__all__ = ["DtypeWarning", "check_published_tensors"]


def _dtype_and_shape(value: Any) -> tuple[str | None, tuple[int, ...]]:
    """A tensor's safetensors dtype and shape, without copying its bytes anywhere."""
    if isinstance(value, TensorData):
        return value.dtype, tuple(value.shape)
    dtype = getattr(value, "dtype", None)
    name = getattr(dtype, "name", None) if isinstance(value, np.ndarray) else str(dtype)
    return safetensors_dtype(str(name)), tuple(int(d) for d in getattr(value, "shape", ()))


def check_published_tensors(
    tensors: Mapping[str, Any],
    *,
    base: Mapping[str, Any] | None,
    extra_files: Mapping[str, bytes] | None,
    delta: bool,
) -> None:
    """What publishing in-memory tensors checks first (``HotLoader.publish``, ``SnapshotStore.upload_tensors``).

    The served dtype is the one to publish in (snapshot-format.md 3.1: a snapshot's names,
    dtypes and shapes equal the served model's). It is known exactly where ``base`` is
    given (the weights replicas serve), and declared by ``config.json``'s ``torch_dtype``
    for a FULL snapshot:

    - a delta (``delta``, against ``base``): a tensor whose dtype differs from the served
      one is an error naming both (an XOR delta cannot change a dtype, and the usual cause
      is numpy's float32 standing in for BF16);
    - a FULL snapshot needs ``config.json`` in ``extra_files`` (a JSON object), like a
      FULL directory; with ``base`` its names, dtypes and shapes must equal the served
      ones (an error otherwise);
    - a FULL snapshot's F16/BF16/F32/F64 tensors in another dtype than ``config.json``'s
      ``torch_dtype`` (or ``dtype``) give one :class:`DtypeWarning` naming the served
      dtype; not with a ``quantization_config`` (mixed dtypes by design), nor without a
      declared dtype.

    Raises:
        SnapshotError: as above.
    """
    if delta and base is not None:
        changed = []
        for name, value in tensors.items():
            if name in base:
                mine, served = _dtype_and_shape(value)[0], _dtype_and_shape(base[name])[0]
                if mine is not None and served is not None and mine != served:
                    changed.append(f"{name!r} is {mine}, served as {served}")
        if changed:
            raise SnapshotError(
                f"the delta's tensors must keep the served dtypes: {'; '.join(changed[:3])}"
                + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
                + "; convert them (numpy has no bfloat16: pass TensorData('BF16', shape, raw_bytes) or "
                "torch.bfloat16 tensors)"
            )
        return
    if delta:
        return
    raw = (extra_files or {}).get("config.json")
    if raw is None:
        raise SnapshotError(
            "a FULL snapshot needs the model's config.json: pass extra_files={'config.json': <its bytes>} "
            "(the served model's own, with its torch_dtype)"
        )
    try:
        config = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"config.json of the FULL snapshot is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SnapshotError(f"config.json of the FULL snapshot must be a JSON object, not {type(config).__name__}")
    if base is not None:
        problems = [f"{name!r} is missing" for name in base if name not in tensors]
        problems += [f"{name!r} is not served" for name in tensors if name not in base]
        for name, value in tensors.items():
            if name in base:
                ours, served_as = _dtype_and_shape(value), _dtype_and_shape(base[name])
                if ours[0] is not None and served_as[0] is not None and ours != served_as:
                    problems.append(
                        f"{name!r} is {ours[0]} {list(ours[1])}, served as {served_as[0]} {list(served_as[1])}"
                    )
        if problems:
            raise SnapshotError(
                f"a FULL snapshot must match the served weights (base=) in names, dtypes and shapes: "
                f"{'; '.join(problems[:3])}" + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            )
    check_declared_dtype({name: _dtype_and_shape(value)[0] for name, value in tensors.items()}, config)
