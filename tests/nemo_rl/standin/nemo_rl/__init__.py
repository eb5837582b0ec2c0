"""Stand-in for NeMo-RL v0.7.0 (tests only)."""

__version__ = "0.7.0"
