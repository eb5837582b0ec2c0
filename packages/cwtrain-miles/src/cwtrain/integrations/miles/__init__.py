"""cwtrain-miles: publish miles weight versions by checkpoint hot-load (work in progress)."""
