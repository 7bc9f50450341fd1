"""DeepSpeed ZeRO training units: a Megatron-core GPTModel inside a DeepSpeed engine (effectful).

A ZeRO unit is one trained model-stage at tp = pp = 1 over its DP ranks: every rank holds the
whole model (Megatron-core's GPTModel, as the Megatron engine builds it) and DeepSpeed's ZeRO
optimizer (stage 1, 2 or 3) over torch's Adam partitions the fp32 master parameters and Adam's
moments (stage 3: the parameters too) across the unit's DP group. The DP group is an explicit
process group, handed to DeepSpeed through a model-parallel unit object (``mpu``), never a global.

Training keeps the Megatron engine's RL losses, data order and schedule: the step's own
forward/backward (:func:`nereus.engines.pipeline.forward_backward`) calls ``backward()`` on the
losses (DeepSpeed's torch-style backward: its gradient hooks accumulate), then
:meth:`ZeroUnit.step` lets DeepSpeed reduce the gradients over the DP group and step
(``managed_gradient_accumulation: false``: the step is the accumulation boundary). DeepSpeed
averages gradients over DP while the RL losses are normalized by the global token count (a sum
over replicas), so the losses are scaled by dp before backward: an exact power-of-two scaling
at dp = 2, 4, 8 (the update equals the sum-reduced one up to the reduction order).

The partition metadata Nereus reads (:func:`rank_partitions`) is DeepSpeed's own: every
parameter's ``_hp_mapping`` (its fragment in the flat fp32 partition and in the parameter) and the
optimizer's ``partition_size`` — the universal-checkpoint metadata — from which
:mod:`nereus.emu.zero` plans a live DP change.

``import deepspeed`` happens in :func:`deepspeed_module` only (the package is an optional extra:
``pip install 'nereus[deepspeed]'``); on a host without CUDA it is told to use its CPU
accelerator (``DS_ACCELERATOR=cpu``, set before the import).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from nereus.config.run import DEEPSPEED_OWNED_KEYS
from nereus.emu.shards import LocalShard, shards_at
from nereus.emu.unit import Emu, Layout
from nereus.emu.zero import Fragment, RankPartition
from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.engines.pipeline import LossFn, forward_backward, stage_link
from nereus.errors import ConfigError, TransitionError
from nereus.spec.model import ModelSpec

ZERO_STAGES = (1, 2, 3)
# DeepSpeed config keys Nereus sets itself (the batch, the optimizer, the precision, the stage)
OWNED_KEYS = DEEPSPEED_OWNED_KEYS  # set by Nereus: refused when the config is read
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class DeepSpeedOptions:
    """``runtime.deepspeed``: the ZeRO stage and further DeepSpeed config keys (JSON values)."""

    zero_stage: int = 1
    config: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        path = "runtime.deepspeed"
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise ConfigError(f"{path}.zero_stage", self.zero_stage, "must be one of 1, 2, 3")
        for key, value in self.config:
            if key in OWNED_KEYS:
                raise ConfigError(f"{path}.config.{key}", value,
                                  "set by Nereus (batch, optimizer, precision): not configurable")
            if key == "zero_optimization" and (not isinstance(value, Mapping)
                                               or "stage" in value):
                raise ConfigError(f"{path}.config.zero_optimization",
                                  value, "must be a mapping without 'stage' (use zero_stage)")

    def ds_config(self) -> dict[str, Any]:
        """The DeepSpeed config of a unit (fp32, Nereus' Adam, one micro-batch per step())."""
        extra = {k: v for k, v in self.config}
        zero = dict(extra.pop("zero_optimization", {}) or {})
        zero["stage"] = self.zero_stage
        return {**extra,
                "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "managed_gradient_accumulation": False, "zero_optimization": zero,
                "zero_allow_untested_optimizer": True,
                # DeepSpeed clips at norm 1.0 unless told; the Megatron engine does not clip
                "gradient_clipping": extra.get("gradient_clipping", 0.0),
                "steps_per_print": extra.get("steps_per_print", 1 << 30)}

    def to_dict(self) -> dict[str, Any]:
        return {"zero_stage": self.zero_stage, "config": dict(self.config)}


def deepspeed_module() -> Any:
    """``import deepspeed`` (CPU accelerator where torch sees no CUDA device; quiet logger)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)
    return deepspeed


def require_deepspeed(engine: str) -> None:
    """Before any rank starts: the ``deepspeed`` package must import when it is the engine."""
    if engine != "deepspeed":
        return
    try:
        deepspeed_module()
    except Exception as e:  # ImportError, or a broken install raising anything on import
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError("runtime.train_engine", engine,
                          f"needs the deepspeed package (pip install 'nereus[deepspeed]'): "
                          f"{first}") from None


class _Mpu:
    """The model-parallel unit DeepSpeed asks for its groups: the unit's explicit DP group and,
    at tp = pp = 1, this rank alone as the model-parallel group."""

    def __init__(self, dp_group: Any, solo: Any) -> None:
        self.dp_group, self.solo = dp_group, solo

    def get_data_parallel_group(self) -> Any:
        return self.dp_group

    def get_data_parallel_rank(self) -> int:
        return int(dist.get_rank(self.dp_group))

    def get_data_parallel_world_size(self) -> int:
        return int(dist.get_world_size(self.dp_group))

    def get_model_parallel_group(self) -> Any:
        return self.solo

    get_tensor_model_parallel_group = get_model_parallel_group

    def get_model_parallel_rank(self) -> int:
        return 0

    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_model_parallel_world_size(self) -> int:
        return 1

    get_tensor_model_parallel_world_size = get_model_parallel_world_size


class _CheckMpu:
    """A one-rank stand-in for :func:`check_config` (no process group needed)."""

    def get_data_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_world_size(self) -> int:
        return 1

    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_model_parallel_rank(self) -> int:
        return 0


def check_config(options: DeepSpeedOptions) -> None:
    """DeepSpeed's own validation of the unit config; a bad key or value raises one ConfigError
    naming ``runtime.deepspeed.config.<key path>``."""
    ds = deepspeed_module()
    from pydantic import ValidationError

    try:
        ds.DeepSpeedConfig(options.ds_config(), mpu=_CheckMpu())
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        model = e.title.lower()
        where = "zero_optimization" if "zero" in model else ""
        path = ".".join(p for p in ("runtime.deepspeed.config", where, loc) if p)
        value = err.get("input")
        raise ConfigError(path, value, str(err.get("msg", "invalid"))) from None
    except (AssertionError, ValueError, KeyError, TypeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError("runtime.deepspeed.config", dict(options.config),
                          f"rejected by DeepSpeed: {first}") from None


@dataclass
class ZeroUnit:
    """This rank's part of one ZeRO unit: the model, DeepSpeed's engine and ZeRO optimizer."""

    spec: ModelSpec
    emu: Emu  # this rank's tp=pp=1 replica (the DP ranks are ``dp_ranks``)
    global_rank: int
    groups: StageGroups
    dp_group: Any
    dp_ranks: tuple[int, ...]
    model: torch.nn.Module
    engine: Any
    options: DeepSpeedOptions
    counters: Any = None  # nereus.runtime.worker.state.Counters
    tensor_numels: tuple[tuple[str, int], ...] = field(default=())

    @property
    def optimizer(self) -> Any:
        """DeepSpeed's ZeRO optimizer (``.optimizer`` is torch's Adam over the partitions)."""
        return self.engine.optimizer

    @property
    def dp(self) -> int:
        return len(self.dp_ranks)

    @property
    def position(self) -> tuple[int, int]:
        return 0, 0

    @property
    def zero_stage(self) -> int:
        return int(self.options.zero_stage)

    def params(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def shards(self) -> tuple[LocalShard, ...]:
        """The whole model (tp = pp = 1): what a weight sync reads from this rank."""
        return shards_at(self.spec, self.emu.layout, 0, 0)

    def tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """The parameters by local key (field ``param`` only: the Adam state is partitioned)
        — the view :class:`nereus.runtime.execution.torch_executor.TorchExecutor` reads in a
        weight sync. ZeRO stages 1 and 2 hold every parameter whole on every DP rank."""
        self._stage12()
        params = self.params()
        return {"param": {s.local_key: params[s.local_key].data for s in self.shards()}}

    def partitions(self) -> tuple[RankPartition, ...]:
        return rank_partitions(self.engine)

    def hp(self, group: int) -> torch.Tensor:
        """The flat fp32 master partition of param group ``group`` on this rank."""
        self._stage12()
        return self.optimizer.single_partition_of_fp32_groups[group]

    def moment(self, group: int, key: str) -> torch.Tensor:
        """Adam's ``key`` (exp_avg / exp_avg_sq) of the flat partition of ``group``."""
        self.ensure_state()
        return self.optimizer.optimizer.state[self.hp(group)][key]

    def ensure_state(self) -> None:
        """Adam's state of every partition, created as torch's Adam does at its first step
        (zero moments, step 0) when the optimizer has not stepped, and linked to DeepSpeed's
        per-parameter fragments (as its own first step links them)."""
        opt = self.optimizer
        created = False
        for g in range(len(opt.optimizer.param_groups)):
            hp = self.hp(g)
            state = opt.optimizer.state[hp]
            if not state:
                state["step"] = torch.tensor(0.0)
                for k in MOMENTS:
                    state[k] = torch.zeros_like(hp, memory_format=torch.preserve_format)
                created = True
        if created or not opt._hp_optimizer_states_linked:
            opt._hp_optimizer_states_linked = False
            opt._lazy_init_hp_params_optimizer_state()

    def step_value(self) -> float:
        steps = {float(s["step"]) for s in self.optimizer.optimizer.state.values() if s}
        if len(steps) > 1:
            raise ValueError(f"inconsistent Adam steps {steps}")
        return steps.pop() if steps else 0.0

    def set_step(self, value: float) -> None:
        self.ensure_state()
        for g in range(len(self.optimizer.optimizer.param_groups)):
            self.optimizer.optimizer.state[self.hp(g)]["step"].fill_(value)

    def forward_backward(self, microbatches: Sequence[torch.Tensor], loss_fn: LossFn,
                         valid: Sequence[torch.Tensor | None] | None = None) -> float:
        """Accumulate the gradients of ``loss_fn`` over ``microbatches`` (padded where
        ``valid`` is False; the Megatron engine's schedule and losses; scaled by dp, see the
        module docstring); returns the summed loss."""
        dp = self.dp

        def scaled(i: int, logits: torch.Tensor) -> torch.Tensor:
            return loss_fn(i, logits) * dp

        link = stage_link(self.emu, self.global_rank, self.groups.pp, self.spec.hidden_size)
        return forward_backward(self.engine, link, self.groups.tp, microbatches, scaled,
                                valid) / dp

    def step(self) -> None:
        """DeepSpeed reduces the accumulated gradients over the DP group and steps Adam."""
        self.engine.step()

    def _stage12(self) -> None:
        if self.zero_stage == 3:
            raise TransitionError("ZeRO stage 3 partitions are not exposed for live "
                                  "re-partitioning (stages 1 and 2 are)")

    def destroy(self) -> None:
        """Release DeepSpeed's hooks and buffers (the DP group is the caller's)."""
        self.engine.destroy()


def rank_partitions(engine: Any) -> tuple[RankPartition, ...]:
    """This rank's flat partitions, one per param group, from DeepSpeed's own metadata: each
    parameter's ``_hp_mapping`` (fragment addresses in the parameter and in the partition) and
    the optimizer's ``partition_size`` (ZeRO stages 1 and 2)."""
    opt = engine.optimizer
    if not hasattr(opt, "single_partition_of_fp32_groups"):
        raise TransitionError(f"{type(opt).__name__}: no flat ZeRO partitions to read "
                              "(ZeRO stage 1 or 2 needed)")
    out = []
    for g, params in enumerate(opt.bit16_groups):
        frags = []
        for lp in params:
            m = lp._hp_mapping
            if m is None:
                continue
            frags.append(Fragment(opt.param_names[lp], int(m.lp_fragment_address.start),
                                  int(m.hp_fragment_address.start),
                                  int(m.hp_fragment_address.numel)))
        out.append(RankPartition(g, int(opt.partition_size[g]), tuple(sorted(
            frags, key=lambda f: f.part_start))))
    return tuple(out)


@contextlib.contextmanager
def _no_init_broadcast(ds: Any, skip: bool) -> Iterator[None]:
    """DeepSpeed's engine broadcasts every parameter from DP rank 0 when it is built. A unit about
    to be filled by a re-partition (every value written) skips that: it would send unwritten
    memory. Other builds keep DeepSpeed's behaviour."""
    cls = ds.runtime.engine.DeepSpeedEngine
    if not skip or not hasattr(cls, "_broadcast_model"):
        yield
        return
    original = cls._broadcast_model
    cls._broadcast_model = lambda self: None
    try:
        yield
    finally:
        cls._broadcast_model = original


def build_zero_unit(spec: ModelSpec, emu: Emu, global_rank: int, groups: StageGroups,
                    dp_group: Any, dp_ranks: Sequence[int], options: DeepSpeedOptions, *,
                    lr: float, seed: int = 0, initialize: bool = True,
                    params: Mapping[str, Any] | None = None, counters: Any = None) -> ZeroUnit:
    """Build the GPTModel (tp = pp = 1) of ``emu`` on this rank and wrap it in a DeepSpeed
    engine over ``dp_group`` (collective over the DP group: every DP rank calls it).

    ``params`` (tensor name → array or tensor) fills the parameters before DeepSpeed copies them
    into its flat buffers and fp32 partitions; ``initialize=False`` with no ``params``: a unit
    about to be filled by a re-partition."""
    if emu.layout != Layout(1, 1):
        raise TransitionError(f"the DeepSpeed engine runs DP layouts only (tp = pp = 1), "
                              f"not {emu.layout}")
    ds = deepspeed_module()
    # DeepSpeed's sanity check (under Open MPI it must equal the launcher's local rank); CPU
    # ranks ignore the value
    os.environ.setdefault("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    model = build_gpt(spec, 1, 1, 0, groups, seed=seed, initialize=initialize)
    if params is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.as_tensor(params[name]))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with _no_init_broadcast(ds, skip=not initialize and params is None):
        engine, _, _, _ = ds.initialize(model=model, optimizer=opt, config=options.ds_config(),
                                        mpu=_Mpu(dp_group, groups.solo),
                                        dist_init_required=False)
    numels = tuple((n, int(getattr(p, "ds_numel", p.numel()))) for n, p in model.named_parameters())
    return ZeroUnit(spec, emu, global_rank, groups, dp_group, tuple(dp_ranks), model, engine,
                    options, counters, numels)
