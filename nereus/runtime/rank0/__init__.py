"""The controller rank: its step boundary, its planner port over the CPU runtime, its recorder (effectful)."""
