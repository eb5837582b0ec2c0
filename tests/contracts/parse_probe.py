"""Run slime's or miles' own ``parse_args`` on a command, in this fresh interpreter; print JSON.

Input on stdin: ``{"framework": "slime" | "miles", "argv": [...], "checks": [...]}``. Output,
the last line on stdout: ``{"ok": bool, "error": str | None, "stderr": str, "args": {...},
"checks": {...}}`` (``args`` is ``vars()`` of the parsed namespace, values that are not JSON
as strings).

The one thing replaced: Megatron's argument check reads the GPU's architecture when tensor
parallelism is above 1 (``get_device_arch_version``, which needs a CUDA device). It answers
9 (Hopper, the recipes' H100/H200), so the check behaves as on those GPUs and still demands
``CUDA_DEVICE_MAX_CONNECTIONS=1``.

Checks, run after parsing:

* ``zero-engines`` - the framework's own SGLang server resolution (no Ray, no GPU): slime's
  ``_resolve_sglang_config`` and engine count; miles' ``_resolve_sglang_config`` with each
  model resolved, and its placement-group layout.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from typing import Any


class _Tee(io.StringIO):
    def write(self, text: str) -> int:
        sys.__stderr__.write(text)
        return super().write(text)


def _zero_engines(framework: str, args: Any) -> dict[str, Any]:
    if framework == "slime":
        from slime.ray.rollout import _resolve_sglang_config
        from slime.utils.http_utils import get_rollout_num_engines

        config = _resolve_sglang_config(args)
        return {
            "models": [[m.name, len(m.server_groups)] for m in config.models],
            "num_engines": get_rollout_num_engines(args),
        }
    from miles.ray.placement_group import _get_placement_group_layout
    from miles.ray.rollout import rollout_server

    config = rollout_server._resolve_sglang_config(args)
    models = []
    for model in config.models:
        model.resolve(args)
        models.append([model.name, model.total_num_gpus, bool(model.update_weights), len(model.server_groups)])
    return {"models": models, "placement": list(_get_placement_group_layout(args))}


def main() -> None:
    request = json.loads(sys.stdin.read())
    framework = request["framework"]
    result: dict[str, Any] = {"ok": False, "error": None, "stderr": "", "args": {}, "checks": {}}
    captured = _Tee()
    try:
        import megatron.training.arguments as megatron_arguments

        megatron_arguments.get_device_arch_version = lambda: 9  # no GPU here: answer as a Hopper would
        sys.argv = ["train.py", *request["argv"]]
        with contextlib.redirect_stderr(captured):
            if framework == "slime":
                from slime.utils.arguments import parse_args
            else:
                from miles.utils.arguments import parse_args
            args = parse_args()
        result["ok"] = True
        result["args"] = {key: _jsonable(value) for key, value in vars(args).items()}
        for check in request["checks"]:
            try:
                if check == "zero-engines":
                    result["checks"][check] = _zero_engines(framework, args)
            except BaseException as exc:
                result["checks"][check] = {"error": f"{type(exc).__name__}: {exc}"}
    except BaseException as exc:  # argparse exits; Megatron asserts
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-3000:]
    result["stderr"] = captured.getvalue()[-3000:]
    print(json.dumps(result))


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


if __name__ == "__main__":
    main()
