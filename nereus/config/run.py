"""The ``runtime:`` section of a config: how ``nereus run`` executes the job (checked here).

Keys (all optional): ``ranks`` (CPU ranks, each playing one GPU of the virtual cluster; default
the cluster's GPU count), ``memory_per_rank_gb`` (the virtual device capacity of each rank, for
the planner and the runtime's accounting; default ``cluster.memory_per_gpu_gb``), ``reward``
(``task``: the rule-based task reward, default; ``model``: the reward model's score),
``policy`` (``adaptive``: the controller, default; ``static``: what a fixed-plan framework runs —
the initial TP/PP of every model-stage kept, DP re-fit only when the plan no longer fits), ``steps``, ``seed``, ``max_new_tokens`` (generation limit; default
``job.gen_len``), ``temperature``, ``lr``, ``kl_coef``, ``clip``, ``gae_lambda``, ``adapt``
(run the controller; false keeps the initial plan), ``timeout_s`` (every collective and
transfer), ``events`` (``{at_step: k, remove_node: n}`` / ``{at_step: k, add_node: n}``: the
pool the controller sees shrinks or grows after step k; ``{at_step: k, drain_node: n}``: node n
leaves with notice, its state moved off by the DAG and its ranks ending), ``force_transitions``
(``{at_step: k, layouts: {model-stage: [tp, pp] or [tp, pp, dp]}}``: after step k switch to the
best plan with those layouts, bypassing admission — for tests), ``save_state`` (a .npz of the final global
parameters of every trainable model-stage), ``inject_failure`` (``{rank: r, at_step: k}``: rank r
raises at step k, k = -1 at start — fault injection to test that no rank hangs),
``capacity_drop`` (``{at_step: k, memory_per_rank_gb: g}``: from step k on every rank's virtual
device offers only g GB, as when another tenant takes memory; the runtime's accounting then
reports OOM events, which tell the controller the new capacity — see ``nereus.runtime.worker.memory``),
``failures``
(checkpoints and injected node deaths: ``nereus.config.failures``), ``late_nodes`` (k: the
last k nodes of the cluster are granted later — ``nereus run`` starts only the other nodes' ranks;
an ``add_node`` event for a late node spawns its ranks into the running job, see
``nereus.runtime.mpi.growth``), ``generation`` (the engine actor-gen samples with: ``auto``,
default — vLLM when the ranks are on GPUs and vLLM imports, else Megatron-core, resolved at start
by :func:`resolve_generation`; ``megatron`` — Megatron-core's static inference with a KV cache on
the ranks' device; ``vllm`` — vLLM on CUDA GPUs, :mod:`nereus.engines.vllm_engine`; checked
here: vLLM and a CUDA device must be present and the actor a Llama-family architecture),
A cluster of node groups (``cluster.nodes`` a list) runs when every group is CPU virtual devices
labelled as a vendor (``{count: 1, gpu: cpu, vendor: nvidia}``), one rank per GPU of every group.
``device`` (``auto``, default: a GPU per rank when the cluster names a GPU and the rank has one,
else the CPU; ``cpu``; ``cuda``: a GPU or an error — :mod:`nereus.cluster.devices`),
``train_engine`` (``megatron``, default: the Megatron engine; ``deepspeed``: actor-train and
critic-train run as DeepSpeed ZeRO units on CPU ranks, sync jobs only, their plan space pinned
to tp = pp = 1 — :mod:`nereus.runtime.worker.zero_units`), ``deepspeed`` (``{stage: 1|2,
config: {...}}``: the ZeRO stage and further DeepSpeed config keys; only with
``train_engine: deepspeed``),
``inject_oom`` (``{rank: r, at_step: k}``: rank r runs out of device memory in its first
model-stage of step k — on a GPU a real allocation past the free memory, on a CPU rank the same
error raised — to test that an OOM becomes an urgent replan with the step redone),
``save_hf`` (``{dir, every, roles, max_file_gb}``: the trained actor, and the critic on request,
exported as Hugging Face checkpoints — :mod:`nereus.config.save_hf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.config import fields as f
from nereus.config.failures import FailureOptions, parse_failures
from nereus.config.save_hf import SaveHfOptions, parse_save_hf
from nereus.emu.shards import check_layout
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.spec.hardware import ClusterSpec
from nereus.spec.job import Setup

KEYS = ("ranks", "steps", "seed", "max_new_tokens", "temperature", "lr", "kl_coef", "clip",
        "gae_lambda", "adapt", "timeout_s", "events", "force_transitions", "save_state",
        "inject_failure", "memory_per_rank_gb", "reward", "policy", "capacity_drop", "failures",
        "late_nodes", "generation", "device", "inject_oom", "train_engine", "deepspeed",
        "save_hf")
EVENT_KINDS = ("remove_node", "add_node", "drain_node")
GENERATION_CHOICES = ("auto", "megatron", "vllm")
DEVICE_MODES = ("auto", "cpu", "cuda")  # nereus.cluster.devices.DEVICE_MODES
TRAIN_ENGINES = ("megatron", "deepspeed")
ZERO_RUN_STAGES = (1, 2)  # the stages whose partitions the live re-partition reads
ZERO_MODEL_STAGES = ("actor-train", "critic-train")  # what train_engine: deepspeed runs
# DeepSpeed config keys Nereus sets itself (batch, optimizer, precision): runtime.deepspeed.config
# may not name them (nereus.engines.deepspeed_engine writes them)
DEEPSPEED_OWNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu",
                        "gradient_accumulation_steps", "managed_gradient_accumulation",
                        "optimizer", "scheduler", "fp16", "bf16", "amp",
                        "zero_allow_untested_optimizer")


@dataclass(frozen=True)
class Event:
    at_step: int
    kind: str  # remove_node | add_node | drain_node
    node: int

    def to_dict(self) -> dict[str, Any]:
        return {"at_step": self.at_step, self.kind: self.node}


@dataclass(frozen=True)
class ForcedTransition:
    at_step: int
    layouts: tuple[tuple[str, tuple[int, ...]], ...]  # (tp, pp) or (tp, pp, dp)

    def to_dict(self) -> dict[str, Any]:
        return {"at_step": self.at_step, "layouts": {k: list(v) for k, v in self.layouts}}


@dataclass(frozen=True)
class ZeroRunOptions:
    """``runtime.deepspeed``: the ZeRO stage and further DeepSpeed config keys (checked by
    DeepSpeed on the ranks: ``nereus.engines.deepspeed_engine.check_config``)."""

    stage: int = 1
    config: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "config": dict(self.config)}

    @staticmethod
    def parse(raw: Any) -> ZeroRunOptions:
        path = "runtime.deepspeed"
        raw = f.mapping(path, raw if raw is not None else {}, ("stage", "config"))
        stage = raw.get("stage", 1)
        if isinstance(stage, bool) or stage not in ZERO_RUN_STAGES:
            raise ConfigError(f.join(path, "stage"), stage,
                              "must be 1 or 2 (ZeRO-3 partitions are not re-partitioned live)")
        config = raw.get("config", {})
        if not isinstance(config, Mapping):
            raise ConfigError(f.join(path, "config"), config, "must be a mapping")
        for key, value in config.items():
            at = f.join(f.join(path, "config"), str(key))
            if key in DEEPSPEED_OWNED_KEYS:
                raise ConfigError(at, value, "set by Nereus (batch, optimizer, precision): not "
                                  "configurable")
            if key == "zero_optimization" and (not isinstance(value, Mapping) or "stage" in value):
                raise ConfigError(at, value, "must be a mapping without 'stage' (use "
                                  "runtime.deepspeed.stage)")
        return ZeroRunOptions(stage, tuple(sorted((str(k), v) for k, v in config.items())))


@dataclass(frozen=True)
class RunConfig:
    ranks: int
    steps: int = 8
    seed: int = 0
    max_new_tokens: int = 64
    temperature: float = 1.0
    lr: float = 1e-3
    kl_coef: float = 0.05
    clip: float = 0.2
    gae_lambda: float = 0.95
    adapt: bool = True
    timeout_s: float = 120.0
    events: tuple[Event, ...] = ()
    force_transitions: tuple[ForcedTransition, ...] = ()
    save_state: str = ""
    inject_failure: tuple[int, int] | None = None  # (global rank, step; -1 = at start)
    memory_per_rank_gb: float = 0.0  # 0: the cluster's memory per GPU
    reward: str = "task"  # task: the rule-based task reward; model: the reward model's score
    policy: str = "adaptive"  # adaptive: the controller; static: initial TP/PP, DP re-fit only
    capacity_drop: tuple[int, float] | None = None  # (step, GB per rank from that step on)
    failures: FailureOptions = field(default_factory=FailureOptions)
    late_nodes: int = 0  # the last k nodes are granted later (their ranks spawn at add_node)
    late_ranks: int = 0  # late_nodes · gpus_per_node
    # auto: vLLM on GPUs when it imports, else Megatron-core's KV-cache inference (resolved at
    # start by resolve_generation); megatron; vllm (GPU)
    generation: str = "auto"
    device: str = "auto"  # auto | cpu | cuda (nereus.cluster.devices.select_device)
    inject_oom: tuple[int, int] | None = None  # (global rank, step): an out-of-memory there
    train_engine: str = "megatron"  # megatron | deepspeed (ZeRO units for the trainers)
    deepspeed: ZeroRunOptions = field(default_factory=ZeroRunOptions)
    save_hf: SaveHfOptions = field(default_factory=SaveHfOptions)  # nereus.config.save_hf

    @property
    def zero_stages(self) -> tuple[str, ...]:
        """The model-stages that run as ZeRO units (none with the Megatron engine)."""
        return ZERO_MODEL_STAGES if self.train_engine == "deepspeed" else ()

    @property
    def start_ranks(self) -> int:
        """Ranks started at launch (the late nodes' ranks join at their add_node event)."""
        return self.ranks - self.late_ranks

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in KEYS}
        d["events"] = [e.to_dict() for e in self.events]
        d["force_transitions"] = [t.to_dict() for t in self.force_transitions]
        d["failures"] = self.failures.to_dict()
        d["deepspeed"] = self.deepspeed.to_dict()
        d["save_hf"] = self.save_hf.to_dict()
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RunConfig:
        events = tuple(Event(int(e["at_step"]), k, int(e[k])) for e in d["events"]
                       for k in EVENT_KINDS if k in e)
        forced = tuple(ForcedTransition(int(t["at_step"]), tuple(
            (str(n), tuple(int(x) for x in v)) for n, v in sorted(t["layouts"].items())))
            for t in d["force_transitions"])
        rest = {k: d[k] for k in KEYS if k not in ("events", "force_transitions",
                                                   "inject_failure", "failures", "device",
                                                   "inject_oom", "generation",
                                                   "train_engine", "deepspeed",
                                                   "save_hf")}
        rest["save_hf"] = SaveHfOptions.from_dict(d.get("save_hf"))
        rest["train_engine"] = str(d.get("train_engine", "megatron"))
        rest["deepspeed"] = ZeroRunOptions.parse(d.get("deepspeed"))
        oom = d.get("inject_oom")
        rest["inject_oom"] = None if oom is None else (int(oom[0]), int(oom[1]))
        rest["device"] = str(d.get("device", "auto"))
        rest["generation"] = str(d.get("generation", "auto"))
        fail = d.get("inject_failure")
        drop = d.get("capacity_drop")
        rest["capacity_drop"] = None if drop is None else (int(drop[0]), float(drop[1]))
        return RunConfig(**rest, events=events, force_transitions=forced,
                         failures=FailureOptions.from_dict(d.get("failures")),
                         inject_failure=None if fail is None else (int(fail[0]), int(fail[1])))


def _event(path: str, raw: Any, steps: int, nodes: int) -> Event:
    raw = f.mapping(path, raw, ("at_step", *EVENT_KINDS))
    if "at_step" not in raw:
        raise ConfigError(f.join(path, "at_step"), None, "missing: the step after which it happens")
    at = f.non_negative_int(f.join(path, "at_step"), raw["at_step"])
    kinds = [k for k in EVENT_KINDS if k in raw]
    if len(kinds) != 1:
        raise ConfigError(path, dict(raw), "needs exactly one of remove_node, add_node, drain_node")
    node = f.non_negative_int(f.join(path, kinds[0]), raw[kinds[0]])
    if node >= nodes:
        raise ConfigError(f.join(path, kinds[0]), node, f"no such node (cluster has {nodes})")
    if at >= steps:
        raise ConfigError(f.join(path, "at_step"), at, f"must be < steps={steps}")
    return Event(at, kinds[0], node)


def _forced(path: str, raw: Any, steps: int, setup: Setup) -> ForcedTransition:
    names = setup.job.workflow.names
    raw = f.mapping(path, raw, ("at_step", "layouts"))
    at = f.non_negative_int(f.join(path, "at_step"), raw.get("at_step"))
    if at >= steps - 1:
        raise ConfigError(f.join(path, "at_step"), at, f"must be < steps - 1 = {steps - 1}")
    lay = f.mapping(f.join(path, "layouts"), raw.get("layouts", {}), names)
    out = []
    for name, v in sorted(lay.items()):
        at_name = f.join(f.join(path, "layouts"), name)
        if not (isinstance(v, list) and len(v) in (2, 3)):
            raise ConfigError(at_name, v, "must be [tp, pp] or [tp, pp, dp]")
        tp, pp, *dp = (f.positive_int(at_name, x) for x in v)
        try:  # the layout rules of the runtime's units (pp > 1 runs the CPU pipeline)
            check_layout(setup.job.model(setup.job.workflow.by_name(name).role), Layout(tp, pp))
        except ConfigError as e:
            raise ConfigError(at_name, v, f"{e.field} {e.rule}") from None
        out.append((name, (tp, pp, *dp)))
    if not out:
        raise ConfigError(f.join(path, "layouts"), {}, "must name at least one model-stage")
    return ForcedTransition(at, tuple(out))


def parse_runtime(raw: Mapping[str, Any] | None, setup: Setup, *, ranks: int | None = None,
                  steps: int | None = None, host_cores: int = 0) -> tuple[RunConfig, Setup]:
    """Check the ``runtime:`` section (CLI values override it); returns it and the setup on the
    cluster the ranks form (``ranks`` GPUs: whole nodes of ``gpus_per_node``, or one node) and
    the job's own plan space (``job.space``: what ``nereus plan`` searches, uneven DP and
    Megatron's uneven pipelines included — :func:`runtime_setup`).
    ``host_cores``: the cores the ranks share, when they are CPU ranks on one host (the caller
    counts them; 0: unknown)."""
    raw = f.mapping("runtime", raw or {}, KEYS)
    if setup.job.distributed_optimizer:
        raise ConfigError("job.distributed_optimizer", True,
                          "nereus run keeps every replica's whole optimizer state (DESIGN.md §2.2); "
                          "the distributed optimizer is for nereus plan and simulate")
    cl = setup.cluster
    n = ranks if ranks is not None else raw.get("ranks", cl.num_gpus)
    where = "--ranks" if ranks is not None else "runtime.ranks"
    n = f.positive_int(where, n, "MAX_RANKS")
    if n < 1:
        raise ConfigError(where, n, "must be at least 1 (rank 0 controls and works; see docs)")
    if cl.heterogeneous:
        cluster = _labelled_cluster(cl, where, n)
    elif n <= cl.gpus_per_node:
        cluster = ClusterSpec(1, n, cl.gpu)
    elif n % cl.gpus_per_node:
        raise ConfigError(where, n, f"must be at most or a multiple of gpus_per_node="
                          f"{cl.gpus_per_node}")
    else:
        cluster = ClusterSpec(n // cl.gpus_per_node, cl.gpus_per_node, cl.gpu)
    mem_gb = 0.0
    if "memory_per_rank_gb" in raw:
        mem_gb = f.positive_float("runtime.memory_per_rank_gb", raw["memory_per_rank_gb"],
                                  "MAX_MEMORY_GB")
        cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=round(mem_gb * 1e9)),
                          groups=tuple(replace(g, gpu=replace(g.gpu, memory_bytes=round(
                              mem_gb * 1e9))) for g in cluster.groups))
    if cluster.gpu.vendor == "cpu" and host_cores > 0:
        cluster = replace(cluster, host_cores=host_cores, hosts=1)
    setup = runtime_setup(replace(setup, cluster=cluster))
    n_steps = f.positive_int("--steps" if steps is not None else "runtime.steps",
                             steps if steps is not None else raw.get("steps", RunConfig.steps),
                             "MAX_STEPS")
    # Events are checked against the config's own steps and cluster; a run made shorter or
    # smaller from the command line (--steps, --ranks) drops those that no longer happen in it.
    own_steps = f.positive_int("runtime.steps", raw.get("steps", n_steps), "MAX_STEPS")
    own_nodes = cluster.nodes if ranks is None else max(cluster.nodes, cl.nodes)
    checked = tuple(_event(f"runtime.events[{i}]", e, max(own_steps, n_steps), own_nodes)
                    for i, e in enumerate(_list("runtime.events", raw.get("events", []))))
    events = tuple(e for e in checked if e.at_step < n_steps and e.node < cluster.nodes)
    forced = tuple(t for t in (
        _forced(f"runtime.force_transitions[{i}]", t, max(own_steps, n_steps), setup)
        for i, t in enumerate(_list("runtime.force_transitions",
                                    raw.get("force_transitions", []))))
        if t.at_step < n_steps - 1)
    max_new = f.positive_int("runtime.max_new_tokens",
                             raw.get("max_new_tokens", setup.job.gen_len_p95 or setup.job.gen_len),
                             "MAX_TOKENS")
    longest = setup.job.prompt_len + max_new
    for role, spec in setup.job.models:
        if longest > spec.max_seq_len:
            raise ConfigError("runtime.max_new_tokens", max_new,
                              f"prompt_len + max_new_tokens = {longest} exceeds max_seq_len="
                              f"{spec.max_seq_len} of models.{role}")
    late = f.non_negative_int("runtime.late_nodes", raw.get("late_nodes", 0))
    if late and late >= cluster.nodes:
        raise ConfigError("runtime.late_nodes", late,
                          f"must be < the cluster's {cluster.nodes} nodes (one node starts the job)")
    late_from = cluster.nodes - late
    for e in events:
        if e.kind == "drain_node" and e.node == 0:
            raise ConfigError("runtime.events", e.to_dict(),
                              "node 0 runs the controller and the log: it cannot be drained")
        if e.kind in ("remove_node", "drain_node") and e.node >= late_from:
            raise ConfigError("runtime.events", e.to_dict(),
                              f"node {e.node} is a late node (late_nodes={late}): add it first")
    rc = RunConfig(
        ranks=n, steps=n_steps,
        seed=f.non_negative_int("runtime.seed", raw.get("seed", 0), "MAX_SEED"),
        max_new_tokens=max_new,
        temperature=f.positive_float("runtime.temperature", raw.get("temperature", 1.0)),
        lr=f.positive_float("runtime.lr", raw.get("lr", RunConfig.lr)),
        kl_coef=f.non_negative_float("runtime.kl_coef", raw.get("kl_coef", RunConfig.kl_coef)),
        clip=f.positive_float("runtime.clip", raw.get("clip", RunConfig.clip)),
        gae_lambda=f.fraction("runtime.gae_lambda", raw.get("gae_lambda", RunConfig.gae_lambda),
                              closed_low=True, closed_high=True),
        adapt=f.boolean("runtime.adapt", raw.get("adapt", True)),
        timeout_s=f.positive_float("runtime.timeout_s", raw.get("timeout_s", RunConfig.timeout_s),
                                   "MAX_TIMEOUT_S"),
        events=events, force_transitions=forced,
        save_state=f.optional_path("runtime", raw, "save_state"),
        inject_failure=_failure(raw.get("inject_failure"), n, n_steps),
        memory_per_rank_gb=mem_gb,
        reward=_reward(raw.get("reward", "task"), setup.job.reward_model),
        policy=f.choice("runtime.policy", raw.get("policy", "adaptive"), ("adaptive", "static")),
        capacity_drop=_capacity_drop(raw.get("capacity_drop"), n_steps,
                                     cluster.gpu.memory_bytes / 1e9),
        failures=parse_failures(raw.get("failures"), cluster.nodes, n_steps),
        late_nodes=late, late_ranks=late * cluster.gpus_per_node,
        generation=_generation(raw.get("generation", RunConfig.generation), setup),
        device=f.choice("runtime.device", raw.get("device", RunConfig.device), DEVICE_MODES),
        inject_oom=_injected_oom(raw.get("inject_oom"), n, n_steps),
        train_engine=f.choice("runtime.train_engine", raw.get("train_engine", "megatron"),
                              TRAIN_ENGINES),
        deepspeed=ZeroRunOptions.parse(raw.get("deepspeed")),
        save_hf=parse_save_hf(raw.get("save_hf"), setup),
    )
    _check_zero(rc, raw, setup)
    return rc, setup


def runtime_setup(setup: Setup) -> Setup:
    """The setup ``nereus run``'s controller plans with: the job's plan space unchanged (the
    runtime executes uneven DP — replicas of ⌈n/dp⌉ or ⌊n/dp⌋ sequences — and Megatron's uneven
    pipelines, issue 37), costed with static batches (its engines pad each step's batch to its
    longest response). What the runtime cannot build is left out per model-stage by the
    controller's port, each with its reason (:class:`nereus.runtime.rank0.controller.CpuPort`:
    tied embeddings with pp > 1; the DeepSpeed engine's tp = pp = 1)."""
    return replace(setup, job=replace(setup.job, static_batches=True))


def _labelled_cluster(cl: ClusterSpec, where: str, n: int) -> ClusterSpec:
    """The cluster of node groups ``nereus run`` executes: CPU virtual devices playing vendors
    (``cluster.nodes[i].vendor``), one rank per GPU of every group."""
    for i, g in enumerate(cl.groups):
        if g.gpu.vendor != "cpu":
            raise ConfigError(f"cluster.nodes[{i}].gpu", g.gpu.name,
                              "nereus run runs node groups of CPU virtual devices labelled as "
                              "vendors only ({gpu: cpu, vendor: nvidia|amd}); plan and simulate "
                              "mixed GPUs (nereus plan, nereus simulate)")
    if n != cl.num_gpus:
        raise ConfigError(where, n, f"a cluster of node groups runs one rank per GPU of every "
                          f"group: {cl.num_gpus}")
    return cl


def _check_zero(rc: RunConfig, raw: Mapping[str, Any], setup: Setup) -> None:
    """What ``train_engine: deepspeed`` runs: sync jobs on CPU ranks, the trainers at
    tp = pp = 1 (the planner proposes only that), no node failures or late nodes (the ZeRO
    units' partitioned state is not in the boundary copies those paths restore from)."""
    if rc.train_engine != "deepspeed":
        if "deepspeed" in raw:
            raise ConfigError("runtime.deepspeed", raw["deepspeed"],
                              "only with runtime.train_engine: deepspeed")
        return
    where, value = "runtime.train_engine", "deepspeed"
    if setup.job.mode != "sync":
        raise ConfigError(where, value, f"runs sync jobs only (job.mode is {setup.job.mode})")
    if rc.device == "cuda":
        raise ConfigError(where, value, "runs on CPU ranks only (runtime.device is cuda)")
    fo = rc.failures
    if fo.kill or fo.checkpoint_every or fo.resume:
        raise ConfigError(where, value, "runs without runtime.failures (its ZeRO partitions "
                          "are not checkpointed)")
    if rc.late_nodes:
        raise ConfigError(where, value, "runs without runtime.late_nodes")
    if any(e.kind == "drain_node" for e in rc.events):
        raise ConfigError(where, value, "runs without drain_node events (a drain ends the "
                          "node's ranks; the ZeRO partitions are not in the survivors' copies)")
    for i, t in enumerate(rc.force_transitions):
        for name, lay in t.layouts:
            if name in rc.zero_stages and lay[:2] != (1, 1):
                raise ConfigError(f"runtime.force_transitions[{i}].layouts.{name}", list(lay),
                                  "must be [1, 1] or [1, 1, dp]: the DeepSpeed engine runs "
                                  "tp = pp = 1")


def _list(path: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(path, value, "must be a list")
    return value


def _failure(raw: Any, ranks: int, steps: int) -> tuple[int, int] | None:
    if raw is None:
        return None
    path = "runtime.inject_failure"
    raw = f.mapping(path, raw, ("rank", "at_step"))
    rank = f.non_negative_int(f.join(path, "rank"), raw.get("rank"))
    if rank >= ranks:
        raise ConfigError(f.join(path, "rank"), rank, f"must be < ranks={ranks}")
    at = raw.get("at_step", -1)
    if isinstance(at, bool) or not isinstance(at, int) or not -1 <= at < steps:
        raise ConfigError(f.join(path, "at_step"), at, f"must be -1 (start) .. {steps - 1}")
    return rank, at


def _injected_oom(raw: Any, ranks: int, steps: int) -> tuple[int, int] | None:
    if raw is None:
        return None
    path = "runtime.inject_oom"
    raw = f.mapping(path, raw, ("rank", "at_step"))
    rank = f.non_negative_int(f.join(path, "rank"), raw.get("rank"))
    if rank >= ranks:
        raise ConfigError(f.join(path, "rank"), rank, f"must be < ranks={ranks}")
    at = f.non_negative_int(f.join(path, "at_step"), raw.get("at_step"))
    if at >= steps:
        raise ConfigError(f.join(path, "at_step"), at, f"must be < steps={steps}")
    return rank, at


def _capacity_drop(raw: Any, steps: int, capacity_gb: float) -> tuple[int, float] | None:
    if raw is None:
        return None
    path = "runtime.capacity_drop"
    raw = f.mapping(path, raw, ("at_step", "memory_per_rank_gb"))
    at = f.non_negative_int(f.join(path, "at_step"), raw.get("at_step"))
    if at >= steps:
        raise ConfigError(f.join(path, "at_step"), at, f"must be < steps={steps}")
    gb = f.positive_float(f.join(path, "memory_per_rank_gb"), raw.get("memory_per_rank_gb"),
                          "MAX_MEMORY_GB")
    if gb >= capacity_gb:
        raise ConfigError(f.join(path, "memory_per_rank_gb"), gb,
                          f"must be below the capacity per rank ({capacity_gb:g} GB)")
    return at, gb


def _reward(value: Any, reward_model: bool) -> str:
    choice = f.choice("runtime.reward", value, ("task", "model"))
    if choice == "model" and not reward_model:
        raise ConfigError("runtime.reward", value, "needs job.reward_model: true")
    return choice


def _generation(value: Any, setup: Setup) -> str:
    """``auto``, ``megatron`` or ``vllm``; vLLM needs a Llama-family actor (whether vLLM and a
    CUDA device are present is the runtime's check, :func:`nereus.engines.vllm_engine.
    require_vllm`, made before any rank starts)."""
    path = "runtime.generation"
    choice = f.choice(path, value, GENERATION_CHOICES)
    if choice == "vllm":
        reason = _vllm_architecture_problem(setup)
        if reason:
            raise ConfigError(path, value, reason)
    return choice


def _vllm_architecture_problem(setup: Setup) -> str:
    from nereus.emu.hf_layout import UnsupportedArchitecture, hf_architecture

    try:
        hf_architecture(setup.job.model(setup.job.workflow.by_name("actor-gen").role))
    except UnsupportedArchitecture as e:
        return str(e)
    return ""


def resolve_generation(choice: str, on_gpu: bool, vllm_imports: bool, setup: Setup
                       ) -> tuple[str, str]:
    """The engine ``runtime.generation: choice`` runs (``megatron`` or ``vllm``) and why: ``auto``
    is vLLM when the ranks are on GPUs, vLLM imports and the actor is a Llama-family model;
    otherwise Megatron-core's inference path (on the ranks' device)."""
    if choice != "auto":
        return choice, f"runtime.generation: {choice}"
    if not on_gpu:
        return "megatron", "auto: CPU ranks"
    if not vllm_imports:
        return "megatron", "auto: vLLM does not import here"
    problem = _vllm_architecture_problem(setup)
    if problem:
        return "megatron", f"auto: {problem}"
    return "vllm", "auto: GPU ranks and vLLM imports"
