"""Command-line tools that make inputs for Nereus (e.g. tiny Hugging Face checkpoints)."""
