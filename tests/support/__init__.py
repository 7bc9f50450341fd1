"""Shared test helpers: case generators, the gloo and Slurm harnesses, and the scripts that tests
run as child processes (by path: :data:`support.paths.SUPPORT`). Not a test folder: nothing here
is collected."""
