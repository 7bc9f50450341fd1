"""Shard pack/unpack for transfers (effectful shell: imports torch).

``nereus.kernels.pack`` gathers many strided slices into one contiguous buffer and scatters it
back, with the compiled ``nereus._kernels`` (kernels/cuda, kernels/hip) on GPUs and a torch
fallback elsewhere. ``slices`` and ``table`` hold the torch-free slice geometry and the kernels'
descriptor table.
"""
