"""The CPU controller port keeps the planner's pipeline plans (pp > 1) wherever the runtime's layout
rules allow it, and re-searches a tied-embedding model at pp=1 (the stages themselves, over gloo:
ranks/test_engines_pipeline.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # as in the file it came from: -m 'not slow' selects as before


# ---- the CPU controller port: pp > 1 wherever the runtime's layout rules allow it ----

PPO_8_RANKS = """
job: {algorithm: ppo, mode: sync, global_batch: 16, minibatches: 2, prompt_len: 32, gen_len: 64,
      reward_model: true, uneven_dp: false, pipeline_split: even}
models:
  actor: tiny-gpt
  critic: tiny-gpt
  reference: REFERENCE
  reward: {name: tiny-reward, num_layers: 2, hidden_size: 64, ffn_hidden_size: 256,
           num_attention_heads: 4, num_kv_heads: 2, vocab_size: 128, learned_positions: true,
           max_seq_len: 256}
cluster: {nodes: 2, gpus_per_node: 4, gpu: cpu, memory_per_gpu_gb: 0.5}
controller: {delta_len: 0.3, gamma: 0.5, memory_headroom: 0.1}
runtime: {steps: 8, max_new_tokens: 160, memory_per_rank_gb: 0.084}
"""
TIED_REFERENCE = ("{name: tiny-tied, num_layers: 4, hidden_size: 64, ffn_hidden_size: 256, "
                  "num_attention_heads: 4, num_kv_heads: 2, vocab_size: 128, "
                  "learned_positions: true, max_seq_len: 256, tie_embeddings: true}")


def test_cpu_port_keeps_pipeline_plans_and_pins_tied_embeddings_to_one_stage(
        tmp_path: Path) -> None:
    """The example's PPO job (tight virtual memory) in the even space (uneven DP would take the
    memory pressure instead): the planner puts ref-inf on two pipeline stages, and the CPU port
    keeps that; with a tied-embedding reference model (pp=1 only in the runtime) the port
    re-searches ref-inf at pp=1."""
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.control.signals import Observation
    from nereus.runtime.rank0.controller import RankZeroController

    layouts = {}
    for name, ref in (("untied", "tiny-gpt"), ("tied", TIED_REFERENCE)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(PPO_8_RANKS.replace("REFERENCE", ref))
        cfg = load_config(str(path))
        _, setup = parse_runtime(cfg.section("runtime"), cfg.setup)
        port = RankZeroController(setup, adapt=True).port()
        obs = Observation(0, 64.0, 64.0, setup.cluster.all_gpus())
        planner_only = port.base.search(obs)
        found = port.search(obs)
        assert planner_only is not None and found is not None
        layouts[name] = ({sp.name: sp.pp for sp in planner_only[0].stages},
                         {sp.name: sp.pp for sp in found[0].stages})
    base_untied, cpu_untied = layouts["untied"]
    base_tied, cpu_tied = layouts["tied"]
    assert max(cpu_untied.values()) > 1 and cpu_untied == base_untied  # pp > 1 runs as planned
    assert base_tied["ref-inf"] > 1 and cpu_tied["ref-inf"] == 1  # tied: re-searched at pp=1
