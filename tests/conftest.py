"""Shared pytest fixtures. Keep this small: fixtures live in conftest_*.py modules imported here."""

from conftest_slurm import slurm_cluster  # noqa: F401  (session fixture: local 3-node Slurm)
