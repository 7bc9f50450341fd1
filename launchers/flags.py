"""One renderer of Slurm flags, for srun command lines, ``#SBATCH`` directives and submitit.

As submitit's ``_as_sbatch_flag``: a key in Python spelling (``ntasks_per_node``) becomes
``--ntasks-per-node``; ``True`` renders the bare flag (``--no-kill``); ``None`` and ``False``
leave it out; any other value is ``--key=value``. Every place that writes a Slurm flag goes
through :func:`slurm_flags`, so srun, sbatch and submitit spell a setting the same way.
"""

from __future__ import annotations

from collections.abc import Iterable


def as_flag(key: str, value: object) -> str:
    """``("ntasks_per_node", 4)`` → ``--ntasks-per-node=4``; ``("no_kill", True)`` →
    ``--no-kill``."""
    name = key.replace("_", "-")
    if value is True:
        return f"--{name}"
    return f"--{name}={value}"


def slurm_flags(pairs: Iterable[tuple[str, object]]) -> list[str]:
    """The flags of ``(key, value)`` pairs in order, skipping unset (None) and off (False)."""
    return [as_flag(k, v) for k, v in pairs if v is not None and v is not False]
