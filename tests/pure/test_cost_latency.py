"""Latency model: monotonicity, communication terms, pipeline schedule, step critical path."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.calibration import default_calibration
from nereus.cost.latency import stage_latency, step_latency_s, sum_max_linear
from nereus.errors import ConfigError
from nereus.spec.hardware import GPU_PRESETS, ClusterSpec, OpClass
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import MODEL_PRESETS
from nereus.spec.plan import Candidate
from nereus.spec.workflow import ModelStage, build_workflow

CALIB = default_calibration()
ROLES = ("actor", "critic", "reward", "reference")


def make_setup(
    model: str = "llama-3.1-8b",
    gpu: str = "h200",
    nodes: int = 4,
    gpus_per_node: int = 8,
    global_batch: int = 64,
    prompt_len: int = 1024,
    gen_len: int = 2048,
    minibatches: int = 1,
    algorithm: str = "ppo",
    mode: str = "sync",
) -> Setup:
    m = MODEL_PRESETS[model]
    job = JobSpec(
        algorithm=algorithm, mode=mode, models=tuple((r, m) for r in ROLES),
        global_batch=global_batch, prompt_len=prompt_len, gen_len=gen_len, minibatches=minibatches,
    )
    return Setup(job, ClusterSpec(nodes, gpus_per_node, GPU_PRESETS[gpu]))


def stage(setup: Setup, name: str) -> ModelStage:
    return setup.job.workflow.by_name(name)


def cand(setup: Setup, name: str, tp: int, pp: int, dp: int, mb: int = 1, rc: bool = False) -> Candidate:
    ms = stage(setup, name)
    n = setup.job.sequences(ms.sequences_per_prompt) // (setup.job.minibatches if ms.trainable else 1)
    assert n % (dp * mb) == 0
    return Candidate(name, tp, pp, dp, mb, n // (dp * mb), rc)


NAMES = ("actor-gen", "ref-inf", "critic-inf", "actor-train", "critic-train")


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 4]),
    prompt=st.integers(16, 2048),
    gen=st.integers(1, 4096),
    extra=st.integers(1, 2048),
    model=st.sampled_from(["llama-3.1-8b", "qwen3-14b", "small-gpt"]),
)
def test_latency_monotone_in_sequence_length(
    name: str, tp: int, pp: int, dp: int, prompt: int, gen: int, extra: int, model: str
) -> None:
    short = make_setup(model=model, prompt_len=prompt, gen_len=gen)
    longer_gen = make_setup(model=model, prompt_len=prompt, gen_len=gen + extra)
    longer_prompt = make_setup(model=model, prompt_len=prompt + extra, gen_len=gen)
    c = cand(short, name, tp, pp, dp)
    base = stage_latency(short, stage(short, name), c, CALIB).total_s
    assert base > 0
    assert stage_latency(longer_gen, stage(longer_gen, name), c, CALIB).total_s > base
    assert stage_latency(longer_prompt, stage(longer_prompt, name), c, CALIB).total_s > base


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(("actor-gen", "ref-inf", "critic-inf")),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2]),
    dp=st.sampled_from([1, 2, 4, 8]),
    mb=st.sampled_from([1, 2, 4]),
    gen=st.integers(64, 4096),
)
def test_generation_and_inference_latency_decrease_with_dp(
    name: str, tp: int, pp: int, dp: int, mb: int, gen: int
) -> None:
    s = make_setup(nodes=16, gen_len=gen)
    ms = stage(s, name)
    one = stage_latency(s, ms, cand(s, name, tp, pp, dp, mb), CALIB).total_s
    two = stage_latency(s, ms, cand(s, name, tp, pp, 2 * dp, mb), CALIB).total_s
    assert two < one


@pytest.mark.parametrize("name", ["actor-train", "critic-train"])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_training_latency_decreases_with_dp_inside_a_node(name: str, tp: int, pp: int) -> None:
    s = make_setup(global_batch=128)
    ms = stage(s, name)
    times = [
        stage_latency(s, ms, cand(s, name, tp, pp, dp), CALIB).total_s
        for dp in (1, 2, 4)
        if dp * tp * pp <= 8
    ]
    assert len(times) >= 2
    assert all(b < a for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("name", NAMES)
def test_tp_comm_zero_at_tp1_and_positive_above(name: str) -> None:
    s = make_setup()
    ms = stage(s, name)
    assert stage_latency(s, ms, cand(s, name, 1, 2, 2), CALIB).component("tp_comm") == 0.0
    assert stage_latency(s, ms, cand(s, name, 2, 2, 2), CALIB).component("tp_comm") > 0.0


@pytest.mark.parametrize("name", NAMES)
def test_pipeline_terms_zero_at_pp1(name: str) -> None:
    s = make_setup()
    lat = stage_latency(s, stage(s, name), cand(s, name, 2, 1, 4), CALIB)
    assert lat.component("pp_p2p") == 0.0
    assert lat.component("pp_bubble") == 0.0
    lat2 = stage_latency(s, stage(s, name), cand(s, name, 2, 2, 4), CALIB)
    assert lat2.component("pp_bubble") > 0.0


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4, 8, 16]),
    dp=st.sampled_from([1, 2, 4]),
    mb=st.sampled_from([1, 2]),
    rc=st.booleans(),
)
def test_components_add_up_and_are_deterministic(
    name: str, tp: int, pp: int, dp: int, mb: int, rc: bool
) -> None:
    s = make_setup()
    c = cand(s, name, tp, pp, dp, mb, rc)
    lat = stage_latency(s, stage(s, name), c, CALIB)
    assert lat.total_s == pytest.approx(sum(v for _, v in lat.components), rel=1e-12)
    assert all(v >= 0 for _, v in lat.components)
    assert stage_latency(s, stage(s, name), c, CALIB) == lat


def test_pipeline_schedule_matches_formula() -> None:
    """(m − 1) · max τ + Σ τ: with m micro-batches, m·τ_max plus the bubble Σ τ − τ_max."""
    s = make_setup(global_batch=64)
    ms = stage(s, "critic-inf")
    one = stage_latency(s, ms, cand(s, "critic-inf", 1, 4, 64), CALIB)  # m = 1
    many = stage_latency(s, ms, cand(s, "critic-inf", 1, 4, 4), CALIB)  # m = 16, 4x the data
    # m = 1: the whole replica runs one micro-batch through all stages, Σ τ
    sum_tau = one.total_s
    bubble = many.component("pp_bubble")
    tau_max = (many.total_s - bubble) / 16
    assert sum_tau == pytest.approx(bubble + tau_max, rel=1e-9)
    assert tau_max >= sum_tau / 4  # the slowest stage is at least the average


def test_recompute_costs_time() -> None:
    s = make_setup()
    ms = stage(s, "actor-train")
    plain = stage_latency(s, ms, cand(s, "actor-train", 2, 1, 4), CALIB)
    rc = stage_latency(s, ms, cand(s, "actor-train", 2, 1, 4, rc=True), CALIB)
    assert rc.component("compute") == pytest.approx(plain.component("compute") * 4 / 3)
    assert rc.component("tp_comm") == pytest.approx(plain.component("tp_comm") * 6 / 4)


def test_higher_efficiency_is_faster() -> None:
    s = make_setup()
    ms = stage(s, "actor-train")
    c = cand(s, "actor-train", 2, 1, 4)
    slow = stage_latency(s, ms, c, CALIB)
    fast_calib = CALIB
    for _ in range(30):
        fast_calib = fast_calib.with_time_sample(s.cluster.gpu, OpClass.GEMM, 0.9, 1.0, 0.5)
    fast = stage_latency(s, ms, c, fast_calib)
    assert fast.component("compute") < slow.component("compute")
    assert fast.component("tp_comm") == slow.component("tp_comm")


def test_pipeline_across_nodes_pays_inter_node_p2p() -> None:
    s = make_setup(nodes=4, gpus_per_node=8)
    ms = stage(s, "critic-inf")
    inside = stage_latency(s, ms, cand(s, "critic-inf", 4, 2, 2), CALIB)  # 8 GPUs: one node
    across = stage_latency(s, ms, cand(s, "critic-inf", 8, 2, 2), CALIB)  # 16 GPUs: two nodes
    bytes_ratio = s.cluster.gpu.intra_node_gbps / s.cluster.gpu.inter_node_gbps
    assert across.component("pp_p2p") > inside.component("pp_p2p") * bytes_ratio * 0.5


def test_dp_sync_uses_inter_node_link_when_spanning_nodes() -> None:
    s = make_setup(nodes=4, gpus_per_node=8, global_batch=64)
    ms = stage(s, "actor-train")
    inside = stage_latency(s, ms, cand(s, "actor-train", 4, 1, 2), CALIB).component("dp_sync")
    across = stage_latency(s, ms, cand(s, "actor-train", 8, 1, 2), CALIB).component("dp_sync")
    assert inside > 0
    # half the gradient bytes per GPU at tp=8, but over the inter-node link
    assert across > inside * 2
    assert stage_latency(s, ms, cand(s, "actor-train", 8, 1, 1), CALIB).component("dp_sync") == 0


def test_minibatches_repeat_the_update() -> None:
    one = make_setup(global_batch=64, minibatches=1)
    four = make_setup(global_batch=64, minibatches=4)
    ms = stage(one, "actor-train")
    l1 = stage_latency(one, ms, Candidate("actor-train", 2, 1, 4, 1, 16), CALIB)
    l4 = stage_latency(four, ms, Candidate("actor-train", 2, 1, 4, 1, 4), CALIB)
    assert l4.component("compute") == pytest.approx(l1.component("compute"))
    assert l4.component("optimizer") == pytest.approx(4 * l1.component("optimizer"))


@pytest.mark.parametrize(
    "bad",
    [
        Candidate("actor-train", 2, 1, 4, 1, 3),  # 12 != 64 sequences
        Candidate("actor-train", 0, 1, 4, 1, 16),
        Candidate("actor-train", 1, 64, 1, 1, 64),  # more stages than 32 layers
    ],
)
def test_bad_candidate_is_config_error(bad: Candidate) -> None:
    s = make_setup()
    with pytest.raises(ConfigError):
        stage_latency(s, stage(s, "actor-train"), bad, CALIB)


def test_step_critical_path_sync_is_sum_of_phase_maxima() -> None:
    wf = build_workflow("ppo", "sync")
    times = {"actor-gen": 10.0, "ref-inf": 1.0, "reward-inf": 2.0, "critic-inf": 1.5,
             "actor-train": 4.0, "critic-train": 5.0}
    assert step_latency_s(wf, times) == pytest.approx(10.0 + 2.0 + 5.0)


def test_step_critical_path_async_is_max_of_lanes() -> None:
    wf = build_workflow("ppo", "async")
    times = {"actor-gen": 10.0, "ref-inf": 1.0, "reward-inf": 2.0, "critic-inf": 1.5,
             "actor-train": 4.0, "critic-train": 5.0}
    assert step_latency_s(wf, times) == pytest.approx(10.0)
    times["actor-gen"] = 3.0
    assert step_latency_s(wf, times) == pytest.approx(7.0)


@settings(max_examples=50, deadline=None)
@given(
    algo=st.sampled_from(["ppo", "grpo", "remax"]),
    times=st.lists(st.floats(0.0, 100.0), min_size=6, max_size=6),
)
def test_async_never_slower_than_sync(algo: str, times: list[float]) -> None:
    sync, asy = build_workflow(algo, "sync"), build_workflow(algo, "async")
    t = dict(zip(sync.names, times, strict=False))
    assert step_latency_s(asy, t) <= step_latency_s(sync, t) + 1e-12
    assert step_latency_s(sync, t) == pytest.approx(
        sum(max(t[n] for n in phase) for phase in sync.phases())
    )


def test_step_missing_stage_is_config_error() -> None:
    with pytest.raises(ConfigError):
        step_latency_s(build_workflow("ppo"), {"actor-gen": 1.0})


@settings(max_examples=200, deadline=None)
@given(
    a1=st.floats(-10, 10), b1=st.floats(-1, 1), a2=st.floats(-10, 10), b2=st.floats(-1, 1),
    n=st.integers(0, 60),
)
def test_sum_max_linear_matches_brute_force(a1: float, b1: float, a2: float, b2: float, n: int) -> None:
    brute = sum(max(a1 + b1 * j, a2 + b2 * j) for j in range(n))
    assert sum_max_linear(a1, b1, a2, b2, n) == pytest.approx(brute, rel=1e-9, abs=1e-9)


def test_generation_decode_dominated_by_weight_reads_at_small_batch() -> None:
    """Batch-1 decode of Llama-3.1-8B at tp=1 on an H200: ~16 GB of weights per token."""
    s = make_setup(global_batch=8, prompt_len=16, gen_len=100)
    ms = stage(s, "actor-gen")
    lat = stage_latency(s, ms, Candidate("actor-gen", 1, 1, 8, 1, 1), CALIB)
    gpu = s.cluster.gpu
    model = s.job.model("actor")
    weights = 2 * (model.num_params() - model.embedding_params())
    per_token = weights / (gpu.hbm_gbps * 1e9 * CALIB.efficiency(gpu, OpClass.DECODE_MEMORY))
    assert lat.component("decode") == pytest.approx(100 * per_token, rel=0.01)


def test_value_head_is_cheaper_than_lm_head() -> None:
    s = make_setup()
    c_ref = cand(s, "ref-inf", 2, 1, 4)
    c_critic = dataclasses.replace(c_ref, name="critic-inf")
    ref = stage_latency(s, stage(s, "ref-inf"), c_ref, CALIB).total_s
    critic = stage_latency(s, stage(s, "critic-inf"), c_critic, CALIB).total_s
    assert critic < ref


def _clear_cost_caches() -> None:
    from nereus.cost.latency import clear_caches

    clear_caches()


@settings(max_examples=40, deadline=None)
@given(
    gens=st.lists(st.integers(1, 4096), min_size=2, max_size=4),
    name=st.sampled_from(NAMES),
    tp=st.sampled_from([1, 2, 8]),
    pp=st.sampled_from([1, 2, 4]),
    gpn=st.sampled_from([4, 8]),
)
def test_cached_results_never_go_stale(gens: list[int], name: str, tp: int, pp: int, gpn: int) -> None:
    """Interleaving setups, calibrations and value-equal copies gives what a cold cache gives."""
    from nereus.cost.memory import rank_memory, stage_memory

    def evaluate(gen: int, calib_eff: float) -> tuple[object, ...]:
        s = make_setup(gen_len=gen, gpus_per_node=gpn)  # a fresh, value-equal object each time
        calib = CALIB.with_time_sample(s.cluster.gpu, OpClass.GEMM, calib_eff, 1.0, 1.0)
        c = cand(s, name, min(tp, gpn), pp, 2)
        ms = stage(s, name)
        return (
            stage_latency(s, ms, c, calib),
            stage_memory(s, ms, c, calib),
            tuple(rank_memory(s, ms, c, calib, r) for r in range(pp)),
        )

    warm = [evaluate(g, e) for g in gens for e in (0.4, 0.8)]
    cold = []
    for g in gens:
        for e in (0.4, 0.8):
            _clear_cost_caches()
            cold.append(evaluate(g, e))
    assert warm == cold
    again = [evaluate(g, e) for g in reversed(gens) for e in (0.8, 0.4)]
    assert again == [warm[2 * i + j] for i in reversed(range(len(gens))) for j in (1, 0)]
