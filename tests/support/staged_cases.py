"""A transition shaped like issue 32's (the target faster, its plain DAG over device memory) at
the size of the CPU tests: tiny-gpt PPO's actor-train (with Adam state) goes from two (tp 1,
pp 4) replicas to two (tp 2, pp 2) replicas on the same 8 GPUs, beside a co-resident actor-gen
(weights only). Every order of the plain DAG splits actor-train through (tp 1, pp 2), holding a
quarter and a half of its state on a GPU at once; with the capacity below that does not fit
beside actor-gen, while the old and the new layouts one after the other (a quarter each) do."""

from __future__ import annotations

from dataclasses import replace

from nereus.emu.primitives import model_state_sizer, shard_bytes
from nereus.emu.unit import Layout
from nereus.spec.hardware import CPU_VIRTUAL, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import TINY_GPT
from nereus.spec.plan import ExecutionPlan, StagePlan

WORLD = 8
STAGES = {"actor-train": True, "actor-gen": False}  # model-stage → trainable
_SIZER = model_state_sizer({m: TINY_GPT for m in STAGES}, STAGES)
TRAIN_BYTES = _SIZER("actor-train")
GEN_BYTES = _SIZER("actor-gen")
# room for actor-gen's shard and 0.6 of actor-train's state: the Split through (1, 2) needs
# 3/4 of it on a GPU, each layout alone 1/4
CAPACITY = shard_bytes(GEN_BYTES, Layout(2, 1)) + int(0.6 * TRAIN_BYTES)
SETUP = Setup(JobSpec("ppo", "sync", (("actor", TINY_GPT), ("critic", TINY_GPT),
                                      ("reference", TINY_GPT)),
                      global_batch=8, prompt_len=8, gen_len=8, reward_model=False),
              ClusterSpec(2, 4, replace(CPU_VIRTUAL, memory_bytes=CAPACITY,
                                        host_memory_bytes=4 * TRAIN_BYTES)))

GEN = StagePlan("actor-gen", 2, 1, 4, 1, 2, replicas=((0, 1), (2, 3), (4, 5), (6, 7)))
CURRENT = ExecutionPlan((GEN, StagePlan("actor-train", 1, 4, 2, 1, 4,
                                        replicas=((0, 1, 2, 3), (4, 5, 6, 7)))))
TARGET = ExecutionPlan((GEN, StagePlan("actor-train", 2, 2, 2, 1, 4,
                                       replicas=((0, 1, 2, 3), (4, 5, 6, 7)))))
# the same job on devices with room for every order of the plain DAG
ROOMY = replace(SETUP, cluster=replace(SETUP.cluster, gpu=replace(SETUP.cluster.gpu,
                                                                  memory_bytes=100 * CAPACITY)))


# Issue 32's case itself (a `nereus simulate` run of Llama-3.1-8B PPO on 32 A100-64GB, the
# preemption trace us-east-2a, at step 18): actor-train (tp 2, pp 2) → (tp 4, pp 1) and
# critic-train (tp 1, pp 8) → (tp 2, pp 4) in place; the plain DAG's Split of actor-train holds
# its old and intermediate shards (84.3 GB) beside ref-inf and actor-gen on one GPU of 64 GB.
def _ppo_8b() -> Setup:
    from nereus.spec.hardware import A100_64GB
    from nereus.spec.model import LLAMA_3_1_8B

    models = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))
    return Setup(JobSpec("ppo", "sync", models, global_batch=256, prompt_len=1024,
                         gen_len=2048, reward_model=False), ClusterSpec(4, 8, A100_64GB))


ISSUE_SETUP = _ppo_8b()
_NODES = [tuple(range(n * 8, n * 8 + 8)) for n in range(4)]
_SOLO = tuple((_NODES[n][k],) for k in range(4) for n in range(4))
_SOLO_HI = tuple((_NODES[n][k],) for k in range(4, 8) for n in range(4))
_ISSUE_COMMON = (StagePlan("actor-gen", 8, 1, 4, 64, 1, replicas=tuple(_NODES)),
                 StagePlan("ref-inf", 1, 1, 16, 1, 16, replicas=_SOLO),
                 StagePlan("critic-inf", 1, 1, 16, 1, 16, replicas=_SOLO_HI))
_TRAIN_REPS = ((16, 17, 18, 19), (24, 25, 26, 27), (20, 21, 22, 23), (28, 29, 30, 31))
ISSUE_CURRENT = ExecutionPlan((*_ISSUE_COMMON,
                               StagePlan("actor-train", 2, 2, 4, 1, 64, replicas=_TRAIN_REPS),
                               StagePlan("critic-train", 1, 8, 2, 1, 128,
                                         replicas=(_NODES[0], _NODES[1]))))
ISSUE_TARGET = ExecutionPlan((*_ISSUE_COMMON,
                              StagePlan("actor-train", 4, 1, 4, 1, 64, replicas=_TRAIN_REPS),
                              StagePlan("critic-train", 2, 4, 2, 1, 128,
                                        replicas=(_NODES[0], _NODES[1]))))
