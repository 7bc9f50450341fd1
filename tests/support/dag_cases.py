"""Random transition cases for the DAG tests (pure/test_dag_wire.py, ranks/test_dag_exec_gloo.py):
a source and a target EMU collection of two model-stages sharing 4 GPUs (actor-train with Adam
state, actor-gen with weights only), and the pure compiler's DAG between them."""

from __future__ import annotations

from hypothesis import strategies as st

from nereus.emu.primitives import model_state_sizer
from nereus.emu.unit import Emu, Layout
from nereus.spec.hardware import CPU_VIRTUAL, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import TINY_GPT
from nereus.transition.dag import TransitionDag
from nereus.transition.reference.compile import compile_transition

WORLD = 4
STAGES = {"actor-train": True, "actor-gen": False}  # model-stage → trainable
SETUP = Setup(JobSpec("ppo", "sync", (("actor", TINY_GPT), ("critic", TINY_GPT),
                                      ("reference", TINY_GPT)),
                      global_batch=8, prompt_len=8, gen_len=8, reward_model=False),
              ClusterSpec(2, 2, CPU_VIRTUAL))
SIZER = model_state_sizer({m: TINY_GPT for m in STAGES}, STAGES)
LAYOUTS = [Layout(tp, pp) for tp in (1, 2) for pp in (1, 2, 4) if tp * pp <= WORLD]  # tiny-gpt: 2 KV heads


@st.composite
def collections(draw: st.DrawFn) -> tuple[tuple[Emu, ...], tuple[Emu, ...]]:
    def one(name: str) -> list[Emu]:
        lay = draw(st.sampled_from(LAYOUTS))
        dp = draw(st.integers(1, WORLD // lay.size))
        gpus = draw(st.permutations(range(WORLD)))
        return [Emu(name, name, lay, tuple(gpus[r * lay.size:(r + 1) * lay.size]))
                for r in range(dp)]

    src = tuple(u for name in STAGES for u in one(name))
    tgt = tuple(u for name in STAGES for u in one(name))
    return src, tgt


def compile_case(src: tuple[Emu, ...], tgt: tuple[Emu, ...]) -> TransitionDag:
    return compile_transition(src, tgt, SIZER, conflicts=SETUP.job.workflow.concurrent)


def reachable_by_brute_force(n_gpus: int, src: dict[int, str], tgt: dict[int, str]) -> bool:
    """Brute force over single-GPU replicas: Extend onto a free GPU, Destroy a redundant copy."""
    names = sorted(set(src.values()))
    start = tuple(src.get(g, "") for g in range(n_gpus))
    goal = tuple(tgt.get(g, "") for g in range(n_gpus))
    seen, todo = {start}, [start]
    while todo:
        s = todo.pop()
        if s == goal:
            return True
        count = {m: s.count(m) for m in names}
        for g in range(n_gpus):
            nexts = [m for m in names if count[m]] if not s[g] else \
                ([""] if count[s[g]] >= 2 else [])
            for m in nexts:
                t = s[:g] + (m,) + s[g + 1:]
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
    return False
