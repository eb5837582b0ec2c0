class PY_EXECUTABLES:
    SYSTEM = "python"
    BASE = "uv run --locked"
    VLLM = "uv run --locked --extra vllm"
    FSDP = "uv run --locked --extra fsdp"
    AUTOMODEL = "uv run --locked --extra automodel"
    MCORE = "uv run --locked --extra mcore"
    NEMO_GYM = "uv run --locked --extra nemo_gym"
    SGLANG = "uv run --locked --extra sglang"
