import os
import sys

git_root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))


class PY_EXECUTABLES:
    SYSTEM = sys.executable
    BASE = f"uv run --locked --directory {git_root}"
    VLLM = f"uv run --locked --extra vllm --directory {git_root}"
    FSDP = f"uv run --locked --extra fsdp --directory {git_root}"
    AUTOMODEL = f"uv run --locked --extra automodel --directory {git_root}"
    MCORE = f"uv run --locked --extra mcore --directory {git_root}"
    NEMO_GYM = f"uv run --locked --extra nemo_gym --directory {git_root}"
    SGLANG = f"uv run --locked --extra sglang --directory {git_root}"
