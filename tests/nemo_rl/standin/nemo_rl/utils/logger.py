from typing import Any


class Logger:
    """Records what NeMo-RL's TensorBoard backend would write: scalars only, dicts skipped."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []
        self.skipped: list[str] = []

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        for name, value in metrics.items():
            if prefix:
                name = f"{prefix}/{name}"
            if isinstance(value, (int, float, bool, str)):
                self.scalars.append((name, value, step))
            else:
                self.skipped.append(name)
