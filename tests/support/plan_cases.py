"""Random jobs, clusters and pools for the plan-search property tests (hypothesis strategies)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

from hypothesis import strategies as st

from nereus.cost.calibration import default_calibration
from nereus.cost.memory import stage_memory
from nereus.plan.candidates import CostCache, Costed
from nereus.plan.problem import Problem, build_problem, is_feasible
from nereus.spec.hardware import ClusterSpec, GpuSpec
from nereus.spec.job import JobSpec, PlanSpace, Setup
from nereus.spec.model import LLAMA_3_1_8B, ModelSpec
from nereus.spec.plan import Candidate

# the space nereus run searched before issue 37: pp dividing the layers, dp the batch
EVEN_SPACE = PlanSpace(pipeline="even", uneven_dp=False)

CALIB = default_calibration()


def llama_setup(nodes: int, gen_len: int = 2048, global_batch: int = 512, gpu: GpuSpec | None = None,
                mode: str = "sync") -> Setup:
    from nereus.spec.hardware import H200

    job = JobSpec(
        algorithm="ppo", mode=mode,
        models=(("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B)),
        global_batch=global_batch, prompt_len=1024, gen_len=gen_len, reward_model=False,
    )
    return Setup(job, ClusterSpec(nodes, 8, gpu or H200))


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0]))
    head_dim = draw(st.sampled_from([16, 32, 64]))
    hidden = heads * head_dim
    return ModelSpec(
        name="rand",
        num_layers=draw(st.sampled_from([1, 2, 3, 4, 6, 8])),
        hidden_size=hidden,
        ffn_hidden_size=hidden * draw(st.sampled_from([2, 3, 4])),
        num_attention_heads=heads,
        num_kv_heads=kv,
        vocab_size=draw(st.sampled_from([256, 1024, 4096])),
    )


@st.composite
def setups(
    draw: st.DrawFn,
    max_nodes: int = 3,
    gpus_per_node: tuple[int, ...] = (1, 2, 3, 4),
    algorithms: tuple[str, ...] = ("ppo", "grpo"),
    max_batch: int = 8,
    memory_factors: tuple[float, float] | None = None,
) -> Setup:
    """A random small job on a random cluster whose GPU memory is sometimes tight."""
    algorithm = draw(st.sampled_from(algorithms))
    actor = draw(models())
    critic = draw(st.one_of(st.just(actor), models()))
    reward_model = algorithm == "ppo" and draw(st.booleans())
    roles = [("actor", actor), ("reference", actor)]
    if algorithm == "ppo":
        roles.append(("critic", critic))
    if reward_model:
        roles.append(("reward", critic))
    job = JobSpec(
        algorithm=algorithm,
        mode=draw(st.sampled_from(["sync", "async"])),
        models=tuple(roles),
        global_batch=draw(st.integers(1, max_batch)),
        prompt_len=draw(st.sampled_from([16, 64, 256])),
        gen_len=draw(st.sampled_from([16, 128, 512, 2048])),
        samples_per_prompt=draw(st.sampled_from([1, 2])) if algorithm == "grpo" else 1,
        reward_model=reward_model,
        space=draw(st.sampled_from([PlanSpace(), EVEN_SPACE])),
    )
    # GPU memory relative to the one-GPU peak of actor-train with recompute and b = 1: from
    # "nothing fits one GPU" to "everything fits together".
    probe = GpuSpec(
        name="test-gpu", vendor="cpu", memory_bytes=1 << 40, peak_flops=100e12, hbm_gbps=1000.0,
        intra_node_gbps=200.0, inter_node_gbps=25.0,
    )
    ms = job.workflow.by_name("actor-train")
    seqs = job.sequences_per_update(ms.sequences_per_prompt)
    one = stage_memory(Setup(job, ClusterSpec(1, 1, probe)), ms,
                       Candidate(ms.name, 1, 1, 1, 1, seqs, True), CALIB)
    factor = draw(
        st.floats(*memory_factors) if memory_factors
        else st.one_of(st.floats(0.9, 1.6), st.floats(0.3, 4.0))
    )
    memory = int(one.peak_bytes * factor / 0.9)
    gpu = replace(probe, memory_bytes=memory)
    cluster = ClusterSpec(draw(st.integers(1, max_nodes)), draw(st.sampled_from(gpus_per_node)), gpu)
    return Setup(job, cluster)


@st.composite
def pools(draw: st.DrawFn, setup: Setup) -> tuple[int, ...]:
    """A non-empty, possibly non-contiguous subset of the cluster's GPUs (after failures)."""
    n = setup.cluster.num_gpus
    keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    pool = tuple(g for g in range(n) if keep[g])
    return pool or (draw(st.integers(0, n - 1)),)


def problem_of(setup: Setup, pool: tuple[int, ...]) -> Problem:
    return build_problem(setup, CALIB, pool, CostCache())


def random_feasible_choice(problem: Problem, seed: int, tries: int = 200) -> dict[str, Costed] | None:
    """A random choice of feasible candidates meeting the budgets and the memory bound."""
    rng = random.Random(seed)
    spaces: Mapping[str, tuple[Costed, ...]] = {s.name: s.feasible for s in problem.spaces}
    for _ in range(tries):
        choice = {n: rng.choice(cs) for n, cs in spaces.items()}
        if is_feasible(problem, choice):
            return choice
    return None
