"""The frameworks cwtrain-slime runs inside, and the versions it supports.

Core's :mod:`cwtrain.integrations.frameworks` holds only the mechanism (``require``,
``install_line``); this record is the plug-in's own. Core finds it, to name the fix for a
missing ``slime`` or ``ray`` module, through the ``cwtrain.frameworks`` entry-point group
of this package's ``pyproject.toml``. The plug-ins of slime's forks reuse ``RAY``.
"""

from __future__ import annotations

from cwtrain.integrations.frameworks import Framework

__all__ = ["RAY", "SLIME"]

#: slime: any version (the contract suite names the commit it last passed against).
SLIME = Framework("slime", "slime", "cwtrain-slime", "the slime image ships it", ("slime",))
#: Ray: the publishing actor (:mod:`cwtrain.integrations.slime.actor`) runs as a Ray actor.
RAY = Framework("Ray", "ray", "cwtrain-slime", 'pip install "ray>=2.30"; the framework images ship it', ("ray",))
