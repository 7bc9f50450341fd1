"""Trace-driven simulation of an adaptive RL job over a virtual cluster (`nereus simulate`)."""
