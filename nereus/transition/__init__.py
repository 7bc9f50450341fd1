"""The global transition DAG: compile, validate, cost and schedule plan changes (pure)."""
