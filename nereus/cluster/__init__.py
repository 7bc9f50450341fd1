"""The cluster around a job: its environment (env), Slurm allocation watching (slurm_watch), devices (inventory)."""
