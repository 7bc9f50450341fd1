"""Engines: Megatron-core model builders and (later) generation backends (effectful)."""
