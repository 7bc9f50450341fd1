"""The effectful runtime of ``nereus run``: MPI ranks that execute plans and plan changes.

- ``worker/``: the rank program and its step (units, state, training, generation, memory);
- ``rank0/``: the controller rank's step boundary (observe → calibrate → decide → log → execute),
  its planner port and its recorder;
- ``execution/``: running a plan change (the transition DAG, the torch executor of its
  primitives, process groups and transports, the gather-and-reload fallback);
- ``mpi/``: the MPI control plane, the torch.distributed rendezvous, growth by spawned ranks;
- ``failures/``: surviving dead ranks (ULFM), boundaries, checkpoints, relaunch.
"""
