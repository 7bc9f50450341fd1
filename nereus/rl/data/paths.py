"""Where a path of the ``data:`` and ``reward:`` sections points: relative to the config file's
folder, or ``nereus:NAME`` inside the package's shipped ``data/`` folder (the pattern task)."""

from __future__ import annotations

import os

from nereus.config.data import PACKAGE_PREFIX

PACKAGE_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "data")


def resolve(path: str, base_dir: str) -> str:
    """The absolute path ``path`` names (``base_dir``: the config file's folder)."""
    if path.startswith(PACKAGE_PREFIX):
        return os.path.join(PACKAGE_DATA, path[len(PACKAGE_PREFIX):])
    expanded = os.path.expanduser(path)
    return expanded if os.path.isabs(expanded) else os.path.normpath(
        os.path.join(base_dir, expanded))
