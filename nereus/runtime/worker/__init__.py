"""The rank program of ``nereus run`` and one RL step on a rank: units, logical state, training, generation engines, memory accounting (effectful)."""
