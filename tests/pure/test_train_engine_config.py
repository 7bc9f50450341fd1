"""``runtime.train_engine`` / ``runtime.deepspeed`` (pure): the checks, one line naming field,
value and rule, and the planner of a DeepSpeed run proposing the trainers at tp = pp = 1 only."""

from __future__ import annotations

from typing import Any

import pytest
from support.run_jobs import SMALL

from nereus.config.run import RunConfig, parse_runtime
from nereus.config.schema import parse_config
from nereus.control.signals import Observation
from nereus.errors import ConfigError

JOB = SMALL.replace("cluster: {nodes: 4, gpus_per_node: 1", "cluster: {nodes: 2, gpus_per_node: 2")


def _setup(text: str = JOB) -> Any:
    import yaml

    return parse_config(yaml.safe_load(text)).setup


def test_defaults_and_round_trip() -> None:
    rc, _ = parse_runtime({}, _setup())
    assert rc.train_engine == "megatron" and rc.zero_stages == ()
    rc, _ = parse_runtime({"train_engine": "deepspeed",
                           "deepspeed": {"stage": 2, "config": {"gradient_clipping": 0.0}}},
                          _setup())
    assert rc.zero_stages == ("actor-train", "critic-train")
    assert rc.deepspeed.stage == 2 and dict(rc.deepspeed.config) == {"gradient_clipping": 0.0}
    assert RunConfig.from_dict(rc.to_dict()) == rc


@pytest.mark.parametrize("raw,field", [
    ({"train_engine": "zero"}, "runtime.train_engine"),
    ({"train_engine": "deepspeed", "deepspeed": {"stage": 3}}, "runtime.deepspeed.stage"),
    ({"train_engine": "deepspeed", "deepspeed": {"stage": True}}, "runtime.deepspeed.stage"),
    ({"train_engine": "deepspeed", "deepspeed": {"zero": 1}}, "runtime.deepspeed.zero"),
    ({"train_engine": "deepspeed", "deepspeed": {"config": [1]}}, "runtime.deepspeed.config"),
    ({"deepspeed": {"stage": 1}}, "runtime.deepspeed"),
    ({"train_engine": "deepspeed", "device": "cuda"}, "runtime.train_engine"),
    ({"train_engine": "deepspeed", "failures": {"checkpoint_every": 1}}, "runtime.train_engine"),
    ({"train_engine": "deepspeed", "steps": 3, "force_transitions": [
        {"at_step": 0, "layouts": {"actor-train": [2, 1]}}]},
     "runtime.force_transitions[0].layouts.actor-train"),
])
def test_bad_values_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_runtime(raw, _setup())
    assert str(e.value).startswith(field + "=") and "\n" not in str(e.value)


def test_async_jobs_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        parse_runtime({"train_engine": "deepspeed"}, _setup(JOB.replace("mode: sync",
                                                                         "mode: async")))
    assert str(e.value).startswith("runtime.train_engine='deepspeed'") and "sync" in str(e.value)


def test_forced_layouts_may_pin_dp() -> None:
    rc, _ = parse_runtime({"steps": 3, "force_transitions": [
        {"at_step": 0, "layouts": {"actor-train": [1, 1, 1]}}]}, _setup())
    assert dict(rc.force_transitions[0].layouts) == {"actor-train": (1, 1, 1)}
    with pytest.raises(ConfigError) as e:
        parse_runtime({"steps": 3, "force_transitions": [
            {"at_step": 0, "layouts": {"actor-train": [1, 1, 1, 1]}}]}, _setup())
    assert "must be [tp, pp] or [tp, pp, dp]" in str(e.value)


def test_planner_proposes_the_trainers_at_tp_pp_1_only() -> None:
    """The Megatron engine's plan puts the trainers at tp 2 on this job; the DeepSpeed engine's
    planner never proposes anything but tp = pp = 1 for them, even when asked for another
    (tp, pp), and a forced DP degree is honoured."""
    from nereus.runtime.rank0.controller import RankZeroController

    def controller(engine: str) -> Any:
        rc, setup = parse_runtime({"train_engine": engine}, _setup())
        ctl = RankZeroController(setup, True, dp_only=rc.zero_stages)
        ctl.set_pool(range(rc.ranks))
        return ctl, setup

    ctl, setup = controller("megatron")
    plan, _ = ctl.initial()
    assert plan is not None
    assert {(sp.tp, sp.pp) for sp in plan.stages if sp.name.endswith("-train")} != {(1, 1)}
    ctl, setup = controller("deepspeed")
    plan, _ = ctl.initial()
    assert plan is not None
    trainers = [sp for sp in plan.stages if sp.name.endswith("-train")]
    assert {(sp.tp, sp.pp) for sp in trainers} == {(1, 1)}
    job = setup.job
    obs = Observation(0, float(job.gen_len), float(job.gen_len), ctl.pool)
    got = ctl.port().search(obs, {"actor-train": (2, 1), "critic-train": (1, 1, 1)})
    assert got is not None
    by = {sp.name: sp for sp in got[0].stages}
    assert (by["actor-train"].tp, by["actor-train"].pp) == (1, 1)
    assert (by["critic-train"].tp, by["critic-train"].pp, by["critic-train"].dp) == (1, 1, 1)
    assert RankZeroController.from_dict(setup, ctl.to_dict()).dp_only == ctl.dp_only
