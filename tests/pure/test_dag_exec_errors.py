"""Tier 1 (single rank, no communication): a transfer that fails inside a transition DAG is
reported with where this rank was — the wave, the model-stage and the DAG's primitives — so that
a hang across ranks (each rank times out on its own) shows whether they were in the same wave."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from nereus.emu.primitives import model_state_sizer
from nereus.emu.unit import Emu, Layout
from nereus.errors import CommunicationError
from nereus.runtime.execution import torch_executor as runtime_prims
from nereus.runtime.execution.dag import RankDagExecutor
from nereus.spec.hardware import CPU_VIRTUAL, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import TINY_GPT
from nereus.transition.reference.compile import compile_transition

SETUP = Setup(JobSpec("ppo", "sync", (("actor", TINY_GPT), ("critic", TINY_GPT),
                                      ("reference", TINY_GPT)),
                      global_batch=8, prompt_len=8, gen_len=8, reward_model=False),
              ClusterSpec(2, 2, CPU_VIRTUAL))


def test_a_failed_transfer_names_its_wave_and_model_stage(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    src = (Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),)
    tgt = (Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
           Emu("actor-gen", "actor-gen", Layout(1, 1), (1,)))
    sizer = model_state_sizer({"actor-gen": TINY_GPT}, {"actor-gen": False})
    dag = compile_transition(src, tgt, sizer)
    extend = next(i for i, p in enumerate(dag.primitives) if type(p).__name__ == "Extend")

    def fails(self: runtime_prims.TorchExecutor, ops: object) -> None:
        raise CommunicationError("rank 2: recv from rank 3 failed (timeout 1 s): Timed out")

    monkeypatch.setattr(runtime_prims.TorchExecutor, "concurrent", fails)
    ex = RankDagExecutor(SETUP, dag, {}, 2, dist.HashStore(), "t", timeout_s=1.0, lr=1e-3)
    ex.start(extend, dag.primitives[extend])
    with pytest.raises(CommunicationError) as err:
        ex.wait()
    assert str(err.value) == (f"wave 1, actor-gen primitives [{extend}]: rank 2: recv from "
                              "rank 3 failed (timeout 1 s): Timed out")
