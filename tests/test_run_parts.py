"""Parts of ``nereus run`` that need no MPI job: the runtime section, memory accounting, PPO
normalization, and KV-cache generation on Megatron-core (one gloo process, in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from loss_oracle import policy_loss as masked_policy_loss

from nereus.config.load import load_config
from nereus.config.run import RunConfig, parse_runtime
from nereus.errors import ConfigError
from nereus.rl.ppo import policy_loss_sum, ppo_batch, token_rewards
from nereus.runtime.worker.memory import MemoryAccount, module_state_bytes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "ppo-tiny-cpu.yaml")


def _parse(runtime: dict[str, object], **kw: int) -> tuple[RunConfig, object]:
    cfg = load_config(EXAMPLE)
    return parse_runtime(runtime, cfg.setup, **kw)


def test_runtime_defaults_and_ranks_reshape_the_cluster() -> None:
    rc, setup = _parse({})
    assert rc.ranks == 8 and setup.cluster.nodes == 2  # type: ignore[attr-defined]
    rc, setup = _parse({}, ranks=4)
    assert (setup.cluster.nodes, setup.cluster.gpus_per_node) == (1, 4)  # type: ignore[attr-defined]
    rc, setup = _parse({"memory_per_rank_gb": 0.2})
    assert setup.cluster.gpu.memory_bytes == 200_000_000  # type: ignore[attr-defined]
    assert RunConfig.from_dict(rc.to_dict()) == rc


def test_example_events_parse_and_cli_overrides_drop_those_outside_the_run() -> None:
    cfg = load_config(EXAMPLE)
    rc, _ = parse_runtime(cfg.section("runtime"), cfg.setup)
    assert [(e.at_step, e.kind, e.node) for e in rc.events] == [
        (3, "remove_node", 1), (5, "add_node", 1)]
    rc, _ = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=4, steps=3)
    assert rc.events == () and rc.steps == 3


@pytest.mark.parametrize(("runtime", "kw", "field"), [
    ({"stepz": 3}, {}, "runtime.stepz"),
    ({"steps": 0}, {}, "runtime.steps"),
    ({"events": [{"at_step": 1, "remove_node": 5}]}, {}, "runtime.events[0].remove_node"),
    ({"events": [{"at_step": 1}]}, {}, "runtime.events[0]"),
    ({"force_transitions": [{"at_step": 0, "layouts": {"actor-train": [2, 3]}}]}, {},
     "runtime.force_transitions[0].layouts.actor-train"),
    ({"max_new_tokens": 500}, {}, "runtime.max_new_tokens"),
    ({}, {"ranks": 6}, "--ranks"),
    ({}, {"ranks": 1}, "--ranks"),
    ({"inject_failure": {"rank": 9}}, {}, "runtime.inject_failure.rank"),
    ({"capacity_drop": {"at_step": 8, "memory_per_rank_gb": 0.05}}, {},
     "runtime.capacity_drop.at_step"),
    ({"capacity_drop": {"at_step": 1, "memory_per_rank_gb": 0.5}}, {},
     "runtime.capacity_drop.memory_per_rank_gb"),
    ({"capacity_drop": {"at_step": 1, "gb": 0.05}}, {}, "runtime.capacity_drop.gb"),
])
def test_runtime_errors_name_the_field(runtime: dict[str, object], kw: dict[str, int],
                                       field: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse(runtime, **kw)
    assert e.value.field == field


def test_memory_account_counts_real_bytes_and_reports_oom() -> None:
    model = torch.nn.Linear(10, 10)  # 110 fp32 values
    opt = torch.optim.Adam(model.parameters())
    assert module_state_bytes(model, opt) == 110 * 4
    model(torch.ones(1, 10)).sum().backward()
    opt.step()  # grads + exp_avg + exp_avg_sq (+ two scalar steps)
    assert module_state_bytes(model, opt) == 110 * 4 * 4 + 2 * 4
    acc = MemoryAccount(3, capacity_bytes=2000)
    acc.observe("actor-gen", 1500, 400)
    assert acc.take() == (1900, [])
    acc.observe("actor-gen", 1500, 600)
    peak, events = acc.take()
    assert peak == 2100 and [(e.global_rank, e.model_stage) for e in events] == [(3, "actor-gen")]


def test_run_account_adds_the_planner_reserve_and_applies_the_capacity_drop() -> None:
    from nereus.cost.memory import CPU_WORKSPACE_BYTES
    from nereus.runtime.worker.memory import account_for_run

    rc, setup = _parse({"memory_per_rank_gb": 0.0808,
                        "capacity_drop": {"at_step": 2, "memory_per_rank_gb": 0.07}})
    assert rc.capacity_drop == (2, 0.07) and RunConfig.from_dict(rc.to_dict()) == rc
    acc = account_for_run(1, setup, rc.capacity_drop)  # type: ignore[arg-type]
    assert acc.capacity_bytes == 80_800_000 and acc.reserve_bytes == CPU_WORKSPACE_BYTES
    used = 5_000_000  # 67.1 MB + 5 MB: under 80.8 MB, over 70 MB
    for step in range(4):
        acc.begin_step(step)
        acc.observe("actor-train", used)
        peak, events = acc.take()
        assert peak == CPU_WORKSPACE_BYTES + used
        assert [e.capacity_bytes for e in events] == ([70_000_000] if step >= 2 else [])


def test_loss_sums_over_microbatches_equal_the_minibatch_token_mean() -> None:
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(6, 5, generator=g) > 0.3).double()
    n_tok = float(mask.sum())
    parts = sum(float(policy_loss_sum(logp[a:a + 2], old[a:a + 2], adv[a:a + 2],
                                      mask[a:a + 2], 0.2)) / n_tok for a in range(0, 6, 2))
    assert parts == pytest.approx(float(masked_policy_loss(logp, old, adv, mask, 0.2)), rel=1e-12)


def test_ppo_rewards_put_the_score_on_the_last_response_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    zero = torch.zeros(2, 3, dtype=torch.float64)
    r = token_rewards(torch.tensor([0.5, 1.0], dtype=torch.float64), zero, zero, mask, 0.1)
    assert r.tolist() == [[0.0, 0.5, 0.0], [0.0, 0.0, 1.0]]
    b = ppo_batch(torch.tensor([0.5, 1.0], dtype=torch.float64), zero, zero, zero, mask, 0.1, 1.0)
    assert float((b.returns * mask).sum()) == pytest.approx(0.5 * 2 + 1.0 * 3)


GEN_SCRIPT = r"""
import torch, torch.distributed as dist, numpy as np, sys
torch.set_num_threads(1)
from nereus.runtime.mpi.rendezvous import free_port
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
from nereus.emu.unit import Emu, Layout
from nereus.runtime.execution.groups import unit_groups
from nereus.runtime.worker.state import new_unit_state
from nereus.spec.model import TINY_GPT
from nereus.engines.generation import enable_kv_cache, generate, sample_uniforms
from nereus.engines.forward import logits_of, response_logp
emu = Emu("actor-gen", "actor-gen", Layout(1, 1), (0,))
g = unit_groups(emu, 0, 30)
st = new_unit_state(TINY_GPT, emu, 0, g, seed=3)
enable_kv_cache(st.model, g.tp)
prompts = torch.tensor([[0, 97, 98, 58], [99, 100, 101, 58]])
out = generate(st.model, g.tp, prompts, sample_uniforms(0, 0, np.array([0, 1]), 12), 12)
again = generate(st.model, g.tp, prompts, sample_uniforms(0, 0, np.array([0, 1]), 12), 12)
with torch.no_grad():
    full = response_logp(logits_of(st.model, out.tokens), out.tokens, 4)
diff = float(((full - out.logp) * out.mask).abs().max())
assert torch.equal(out.tokens, again.tokens), "sampling is not reproducible"
assert out.kv_cache_bytes > 0
print("DIFF", diff)
"""


def test_kv_cache_generation_matches_a_full_forward() -> None:
    res = subprocess.run([sys.executable, "-c", GEN_SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    diff = float(res.stdout.split("DIFF")[1])
    assert diff < 1e-5  # decode with the cache vs one full forward: same log-probs (fp32)


def test_missing_mpiexec_is_one_line_and_no_log(tmp_path: Path) -> None:
    log = tmp_path / "x.h5"
    res = subprocess.run([sys.executable, "-m", "nereus", "run", EXAMPLE, "--ranks", "4",
                          "--log", str(log)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={"PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "mpiexec not found" in lines[0], res.stderr
    assert not log.exists()
