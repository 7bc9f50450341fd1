"""Nereus: adaptive parallelism for LLM RL post-training.

The package is split into a pure, deterministic core (``spec``, ``config``, ``cost``, ``plan``,
``emu``, ``transition``, ``control``) that imports only the standard library and numpy, and an
effectful shell (``runtime``, ``engines``, ``rl``, ``cluster``, ``log``, ``sim``, ``cli``).
"""

from nereus.errors import NereusError

__all__ = ["NereusError", "__version__"]
__version__ = "0.1.0"
