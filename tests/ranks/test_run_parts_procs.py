"""Parts of ``nereus run`` that need no MPI job, in child processes: KV-cache generation on
Megatron-core (one gloo process) and the one-line error when mpiexec is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "ppo-tiny-cpu.yaml")
GEN_SCRIPT = r"""
import torch, torch.distributed as dist, numpy as np, sys
torch.set_num_threads(1)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
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
