"""Elastic Model Units: layouts, shard rules, transfer plans and primitive records (pure)."""
