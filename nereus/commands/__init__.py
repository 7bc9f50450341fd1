"""One module per CLI subcommand: ``register(subparsers)`` adds it, its handler returns the exit code.

Command modules import heavy dependencies (torch, mpi4py, h5py) only inside their handlers so that
``nereus --help`` and the pure commands stay fast.
"""
