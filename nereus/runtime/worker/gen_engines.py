"""Which generation engine actor-gen's unit uses on this rank (``runtime.generation``).

``megatron`` (the CPU default): a :class:`~nereus.engines.backend.MegatronEngine` over the unit's own
GPTModel stage, made afresh per call (it holds no state: the unit's model is the engine).
``vllm`` (the GPU default when vLLM imports: ``runtime.generation: auto`` is resolved at start by
:func:`nereus.config.run.resolve_generation`): one :class:`~nereus.engines.vllm_engine.VllmEngine` per unit, built on first use and
kept on the unit's model object (a new unit after a transition gets a new engine); its weights
are refreshed from the unit's global parameters, all-gathered over the unit's tp group as plain
tensors (:mod:`nereus.runtime.worker.piece_gather`: nothing received is unpickled). The
placement check runs on every rank, so a plan vLLM cannot serve fails everywhere at once.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from nereus.config.run import RunConfig
from nereus.emu.shards import tensor_specs
from nereus.engines.backend import VLLM, GenerationEngine, MegatronEngine
from nereus.runtime.worker.piece_gather import all_gather_pieces
from nereus.runtime.worker.state import UnitState
from nereus.runtime.worker.train import link_of
from nereus.runtime.worker.units import StageUnits, local_pieces
from nereus.spec.job import Setup

_CACHE_ATTR = "_nereus_vllm_engine"


def unit_params(st: UnitState) -> dict[str, np.ndarray]:
    """This pipeline stage's global parameters (logical names), gathered over the tp group
    (collective on the unit's tp ranks)."""
    shapes = {t.name: tuple(t.global_shape) for t in tensor_specs(st.spec)}
    group = st.groups.tp
    device = torch.device("cpu") if dist.get_backend(group) == "gloo" else st.torch_device
    parts = all_gather_pieces(local_pieces(st, ("param",)), group, device, shapes)
    out: dict[str, np.ndarray] = {}
    for part in parts:
        for _field, name, start, stop, arr in part:
            dst = out.setdefault(name, np.zeros(shapes[name], dtype=arr.dtype))
            dst[tuple(slice(a, b) for a, b in zip(start, stop, strict=True))] = arr
    return out


def actor_gen_engine(rc: RunConfig, setup: Setup, su: StageUnits) -> GenerationEngine | None:
    """The engine of this rank's actor-gen replica, or None when it holds none. Call on every
    rank (the vLLM placement check must fail on all of them alike)."""
    use_vllm = rc.generation == VLLM  # "auto" is resolved at start (main); unresolved: Megatron
    if use_vllm:
        from nereus.engines.vllm_engine import check_vllm_placement

        check_vllm_placement(su.plan, dist.get_world_size())
    mine = su.my_replica()
    if mine is None:
        return None
    st = mine[1]
    if not use_vllm:
        return MegatronEngine(st.model, st.groups.tp, link_of(st))
    engine: GenerationEngine | None = getattr(st.model, _CACHE_ATTR, None)
    if engine is None:
        from nereus.engines.vllm_engine import VllmEngine, vllm_dtype

        rank = dist.get_rank()
        engine = VllmEngine(
            st.spec, tp=su.plan.tp, params=lambda: unit_params(st),
            max_model_len=setup.job.prompt_len + rc.max_new_tokens, seed=rc.seed, rank=rank,
            local_rank=(st.device.choice.index if st.device is not None and st.device.on_gpu
                        else rank % setup.cluster.gpus_per_node),  # the GPU the rank bound
            dtype=vllm_dtype(setup.job.dtype_bytes))
        setattr(st.model, _CACHE_ATTR, engine)
    return engine
