"""Running a plan change on the ranks: the transition DAG, the torch executor of its primitives, process groups and transports, and the gather-and-reload fallback (effectful)."""
