"""Launch code: pure mpiexec/srun/sbatch builders, the sbatch templates, the submitit entry point."""
