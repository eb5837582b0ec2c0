"""cwtrain-slime: publish slime weight versions by checkpoint hot-load (work in progress)."""
