"""cwtrain-local: the remote side of cwtrain on one machine (work in progress)."""
