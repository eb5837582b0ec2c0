"""cwtrain-nemo-rl: the coreweave generation backend for NeMo-RL (work in progress)."""
