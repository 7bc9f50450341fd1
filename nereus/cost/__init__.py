"""Cost model (latency, memory) and calibration store of Nereus (pure core, DESIGN.md §3)."""
