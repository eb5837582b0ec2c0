"""Helpers of the real-code contract suite: where the frameworks are, their inputs, their parsers.

The suite runs only where the real slime or miles (and what they import: Megatron-LM,
sglang's argument parser, torch) is importable; ``scripts/contracts.sh`` sets that up. One
framework per pytest process: the one whose source tree ``CWTRAIN_SLIME_SRC`` or
``CWTRAIN_MILES_SRC`` names (they need different Megatron-LM and sglang trees).

* :func:`framework_src` - the tree, or a skip with the reason;
* :func:`write_model_dir` - an HF model directory the frameworks accept for Qwen3-4B: its
  public architecture in ``config.json`` and a tiny character tokenizer with a chat
  template (no weights: nothing here loads a model);
* :func:`prepare_work` / :func:`recipe_command` - a recipe's work directory and the training
  command its ``launch.sh`` prints with ``CWTRAIN_DRY_RUN=1``;
* :func:`parse` - the framework's own ``parse_args`` on a command, in a fresh interpreter
  (``parse_probe.py``), returning the parsed namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SOURCE_VARIABLES = {"slime": "CWTRAIN_SLIME_SRC", "miles": "CWTRAIN_MILES_SRC"}
RUN_WITH = "scripts/contracts.sh"

#: Qwen3-4B's public architecture (its config.json), which the recipes' model flags describe.
QWEN3_4B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PROMPTS = [("What is 1+1?", "2"), ("What is 2+3?", "5"), ("What is 3+4?", "7")]


def framework_src(name: str) -> Path:
    """The source tree of ``name`` (slime or miles), importable in this process; else skip, saying why."""
    variable = SOURCE_VARIABLES[name]
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"{variable} is not set: the real-code contract suite runs with {RUN_WITH}")
    src = Path(value).resolve()
    # scripts/contracts.sh sets CWTRAIN_CONTRACT_STRICT: a tree it was told about must be the one tested
    give_up = pytest.fail if os.environ.get("CWTRAIN_CONTRACT_STRICT") else pytest.skip
    try:
        module = __import__(name)
    except ImportError as exc:
        give_up(f"{name} from {variable}={src} is not importable here ({exc}): run the suite with {RUN_WITH}")
    where = Path(str(getattr(module, "__file__", "") or "")).resolve()
    if src not in where.parents:
        give_up(f"the {name} importable here is {where}, not {variable}={src}: put {src} first on PYTHONPATH")
    return src


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_model_dir(directory: Path) -> Path:
    """An HF directory for Qwen3-4B's architecture with a tiny character tokenizer (no weights)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<|endoftext|>": 1, "<|im_start|>": 2, "<|im_end|>": 3}
    for code in [*range(32, 127), 10]:
        vocab.setdefault(chr(code), len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    (directory / "config.json").write_text(json.dumps(QWEN3_4B, indent=2))
    return directory


def prepare_work(recipe: str, work: Path) -> dict[str, str]:
    """What a recipe's job has downloaded by the time it trains; returns the recipe's settings."""
    settings = yaml.safe_load((ROOT / "recipes" / recipe / "config.yaml").read_text(encoding="utf-8"))["data"]
    write_model_dir(work / "hf" / "base")
    (work / "torch_dist").mkdir(parents=True, exist_ok=True)  # the converted checkpoint (--ref-load)
    data = work / "data" / settings["DATASET_FILE"]
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"prompt": p, "label": a}) + "\n" for p, a in PROMPTS))
    return {key: str(value) for key, value in settings.items()}


def recipe_command(recipe: str, framework: Path, work: Path) -> dict[str, Any]:
    """The training command ``recipes/<recipe>/launch.sh`` prints with ``CWTRAIN_DRY_RUN=1``."""
    env = prepare_work(recipe, work)
    env.update(
        CWTRAIN_HOTLOAD_DEPLOYMENT_ID="dep",
        CWTRAIN_ROLLOUT_BASE_URL="https://example.invalid/v1",
        CWTRAIN_ROLLOUT_MODEL="Qwen3-4B",
        AWS_REGION="US-EAST-04A",
        CWTRAIN_GIT="git+https://example.invalid/cwtrain.git@v0",
        PATH=os.environ["PATH"],
        COREWEAVE_API_TOKEN="t",
        WORK_DIR=str(work),
        FRAMEWORK_DIR=str(framework),
        CWTRAIN_DRY_RUN="1",
    )
    done = subprocess.run(
        ["bash", str(ROOT / "recipes" / recipe / "launch.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    command: dict[str, Any] = json.loads(done.stdout)
    return command


def parse(
    framework: str,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    pythonpath: list[str] | None = None,
    checks: tuple[str, ...] = (),
    timeout: float = 600,
) -> dict[str, Any]:
    """``framework``'s own ``parse_args`` on ``argv`` in a fresh interpreter (see ``parse_probe.py``).

    Args:
        framework: ``slime`` or ``miles``.
        argv: the arguments after ``train.py``.
        env: variables to set (the job's runtime environment); ``CUDA_DEVICE_MAX_CONNECTIONS``
            is removed unless given here.
        pythonpath: entries put before this process's ``PYTHONPATH`` (a patched tree).
        checks: extra probes to run after parsing (see ``parse_probe.py``).

    Returns:
        ``{"ok": bool, "error": str | None, "args": {...}, "checks": {...}}``.
    """
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    environ.update(env or {})
    if pythonpath:
        environ["PYTHONPATH"] = os.pathsep.join([*pythonpath, environ.get("PYTHONPATH", "")])
    request = json.dumps({"framework": framework, "argv": argv, "checks": list(checks)})
    done = subprocess.run(
        [sys.executable, str(HERE / "parse_probe.py")],
        input=request,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(HERE),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the parse probe printed no result (exit {done.returncode}):\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def namespace(values: dict[str, Any], **overrides: Any) -> argparse.Namespace:
    """A namespace of parsed values (as the probe returned them), with ``overrides``."""
    return argparse.Namespace(**{**values, **overrides})


def rollout_log_call_site(tree: Path, framework: str) -> tuple[str, list[str]]:
    """Where the framework's actor looks ``log_rollout_data`` up, and the keys its batch carries there.

    Read from ``<framework>/backends/megatron_utils/actor.py`` (not imported: the actor needs
    engines' packages): the ``log_rollout_data(rollout_id, self.args, rollout_data)`` call in
    ``train_actor`` must come after the advantages and before the training step, and the name
    must be a module global of the actor (imported by name) or an attribute of a module the
    actor imported. Returns the module whose ``log_rollout_data`` the actor calls, and the
    ``rollout_data`` keys the actor and its data module name.
    """
    import ast

    actor_path = tree / framework / "backends" / "megatron_utils" / "actor.py"
    module = ast.parse(actor_path.read_text(encoding="utf-8"))
    train = next(node for node in ast.walk(module) if isinstance(node, ast.FunctionDef) and node.name == "train_actor")
    calls = [node for node in ast.walk(train) if isinstance(node, ast.Call)]

    def named(call: ast.Call) -> str | None:
        function = call.func
        return (
            function.id
            if isinstance(function, ast.Name)
            else function.attr
            if isinstance(function, ast.Attribute)
            else None
        )

    log_call = next(call for call in calls if named(call) == "log_rollout_data")
    assert [ast.unparse(a) for a in log_call.args] == ["rollout_id", "self.args", "rollout_data"], ast.unparse(log_call)
    advantages = min(c.lineno for c in calls if named(c) == "compute_advantages_and_returns")
    step = min(c.lineno for c in calls if named(c) == "train")
    assert advantages < log_call.lineno < step, (advantages, log_call.lineno, step)
    package = f"{framework}.backends.megatron_utils"
    if isinstance(log_call.func, ast.Name):
        imported = [
            n
            for n in module.body
            if isinstance(n, ast.ImportFrom) and any(a.name == "log_rollout_data" for a in n.names)
        ]
        assert imported, "log_rollout_data is not imported by name into the actor"
        where = f"{framework}.backends.megatron_utils.actor"
    else:
        owner = ast.unparse(log_call.func.value)  # e.g. train_metric_utils
        source = next(
            n
            for n in module.body
            if isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == owner for a in n.names)
        )
        where = f"{source.module}.{owner}" if source.level == 0 else f"{package}.{owner}"
    text = actor_path.read_text(encoding="utf-8")
    keys = [key for key in ("log_probs", "rollout_log_probs", "loss_masks", "tokens", "response_lengths",
                            "sample_indices") if f'"{key}"' in text or f"'{key}'" in text]  # fmt: skip
    return where, keys
