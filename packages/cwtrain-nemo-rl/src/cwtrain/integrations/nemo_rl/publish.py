"""What of a publish is NeMo-RL's own: the HF side files of its checkpoints.

The distributed publish itself is core's (``cwtrain.hotload``: every worker keeps a
``RankShare`` and calls ``publish_owned``, the driver's ``PublishSession`` commits the
index); :func:`hf_side_files` picks the small files of an HF checkpoint (config,
generation config, tokenizer) that go beside the shards of a FULL snapshot or an exported
checkpoint.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["hf_side_files"]

# Side files that match neither rule of hf_side_files but belong to a tokenizer.
_TOKENIZER_FILES = ("merges.txt",)


def hf_side_files(directory: str | Path) -> dict[str, bytes]:
    """The small files of an HF checkpoint that go beside its shards, by name.

    Every ``*.json`` file but the weight indexes (``*.index.json``, so never
    ``model.safetensors.index.json``), every ``tokenizer*`` file and ``merges.txt``, from
    the top of ``directory``; weights are never included.
    """
    files: dict[str, bytes] = {}
    for item in sorted(Path(directory).iterdir()):
        name = item.name
        json_file = name.endswith(".json") and not name.endswith(".index.json")
        wanted = json_file or name.startswith("tokenizer") or name in _TOKENIZER_FILES
        if wanted and item.is_file():
            files[name] = item.read_bytes()
    return files
