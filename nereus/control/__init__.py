"""The controller: signals → triggers → replan → admission (pure, DESIGN.md §2.1)."""
