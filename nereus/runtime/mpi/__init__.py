"""The MPI side of a job: the control plane, the torch.distributed rendezvous, and ranks spawned for nodes that join (effectful)."""
