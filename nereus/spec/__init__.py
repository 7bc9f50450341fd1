"""Specs: models, hardware, clusters, RL workflows, jobs and plans (pure data)."""
