"""An RL post-training job: models, algorithm, batch and sequence lengths, controller knobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from nereus.spec.hardware import ClusterSpec
from nereus.spec.model import ModelSpec
from nereus.spec.workflow import Workflow, build_workflow


@dataclass(frozen=True)
class ControllerSpec:
    """Knobs of the monitor → replan → admit loop (DESIGN.md §2.1)."""

    delta_len: float = 0.30  # relative drift of generated length that triggers a replan
    delta_efficiency: float = 0.20  # relative drift of achieved efficiency
    gamma: float = 0.5  # payback fraction of the expected interval H_x; 0 admits urgent only
    memory_headroom: float = 0.10  # feasible iff peak ≤ (1 - headroom) · capacity
    calibration_alpha: float = 0.5  # EMA weight of a new calibration sample
    horizon_alpha: float = 0.5  # EMA weight of a new interval between threshold crossings
    # targets whose predicted step times differ by less than this (relative) are a tie: the
    # cheaper transition wins (the cost model's error: MAPE 5% on out-of-sample plans)
    model_error: float = 0.05
    targets: int = 4  # candidate targets a replan plans transitions for (S* and cheaper ones)
    host_staging: bool = True  # stage model-stages through host memory where no DAG order fits
    # weigh each plan's expected checkpoint/restart seconds once the pool has shrunk
    # (nereus.control.exposure)
    loss_exposure: bool = True


PIPELINE_SPLITS = ("even", "uneven")


@dataclass(frozen=True)
class PlanSpace:
    """Which pipeline depths and DP degrees the planner may propose (DESIGN.md §3, issue 20).

    - ``pipeline``: ``"even"``: ``pp`` divides the layers; ``"uneven"``: also depths that do not,
      split as Megatron allows (``nereus.spec.model.pipeline_split``: middle stages even, the
      first and last share the rest); of the depths with the same largest stage only the smallest
      is proposed.
    - ``uneven_dp``: ``dp`` need not divide the sequences of a model-stage: replicas take
      ``⌈n/dp⌉`` or ``⌊n/dp⌋`` of them (generation and inference: prompts; training: sequences of
      an update, the loss normalized over the global batch); of the DP degrees with the same
      largest share only the smallest is proposed. Costs and memory follow the largest share.

    ``nereus plan``, ``simulate`` and ``run`` search the same space (issue 37: the runtime builds
    uneven pipelines and runs uneven DP); ``job.pipeline_split: even`` and ``job.uneven_dp:
    false`` narrow it for all three.
    """

    pipeline: str = "uneven"
    uneven_dp: bool = True



@dataclass(frozen=True)
class JobSpec:
    algorithm: str  # "ppo" | "grpo" | "remax"
    mode: str  # "sync" | "async"
    models: tuple[tuple[str, ModelSpec], ...]  # (role, architecture) for every role used
    global_batch: int  # prompts per step
    prompt_len: int  # tokens
    gen_len: int  # mean generated tokens per response
    gen_len_p95: int = 0  # 0: same as gen_len
    samples_per_prompt: int = 1  # GRPO group size
    minibatches: int = 1  # optimizer updates per step (PPO mini-batches)
    dtype_bytes: int = 2  # bf16
    reward_model: bool = True
    actor_inf: bool = False
    controller: ControllerSpec = field(default_factory=ControllerSpec)
    # The engines run each step's batch padded to its longest response (static batches, no
    # sequence packing or continuous batching: nereus run's engines): time then follows the
    # longest (p95) length, as memory does, instead of the mean.
    static_batches: bool = False
    space: PlanSpace = field(default_factory=PlanSpace)
    # Activation memory without the s² attention scores (flash / memory-efficient SDPA kernels:
    # Megatron-core with Transformer Engine or flash-attn, vLLM, torch SDPA).
    flash_attention: bool = True
    # Megatron's distributed optimizer (ZeRO-1): fp32 master weights and Adam moments sharded
    # over the DP replicas. The EMU runtime keeps whole replicas (DESIGN.md §2.2), so only the
    # planner and the simulator use it.
    distributed_optimizer: bool = False

    def model(self, role: str) -> ModelSpec:
        for r, m in self.models:
            if r == role:
                return m
        raise KeyError(role)

    @property
    def workflow(self) -> Workflow:
        return build_workflow(
            self.algorithm,
            self.mode,
            reward_model=self.reward_model,
            samples_per_prompt=self.samples_per_prompt,
            actor_inf=self.actor_inf,
        )

    @property
    def seq_len(self) -> int:
        """Prompt plus generated tokens of one sequence (the mean)."""
        return self.prompt_len + self.gen_len

    @property
    def max_seq_len(self) -> int:
        """Prompt plus the p95 of generated tokens: what memory is sized for."""
        return self.prompt_len + (self.gen_len_p95 or self.gen_len)

    def sequences(self, sequences_per_prompt: int) -> int:
        return self.global_batch * sequences_per_prompt

    def sequences_per_update(self, sequences_per_prompt: int) -> int:
        return self.global_batch * sequences_per_prompt // self.minibatches


@dataclass(frozen=True)
class Setup:
    """Everything the planner needs: the job and the cluster it runs on."""

    job: JobSpec
    cluster: ClusterSpec
