"""Hugging Face checkpoints in Nereus units, against transformers itself (real models, no
doubles): tiny Llama-3.1 (RoPE scaling), Qwen2 (q/k/v bias, tied), Qwen3 (q/k norm), Mistral
checkpoints written by ``save_pretrained`` (tests/support/hf_checkpoints.py) are read by slices
into Megatron-core units whose logits must equal transformers' within 1e-5 relative — at tp=1
here, at tp=2 and pp=2 after live Merge transitions on 4 gloo ranks; each rank's bytes read are
its shard's; an export from tp=2 and pp=2 of the untrained units equals the source tensor by
tensor. Padding (a left-padded batch against each row alone) and EOS: test_hf_padding.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from support.hf_checkpoints import FAMILIES, checkpoint

from nereus.config.checkpoint import ModelCheckpoint, role_checkpoint
from nereus.config.checkpoint_files import read_checkpoint
from nereus.emu.shards import shards_at
from nereus.emu.unit import Emu, Layout
from nereus.spec.model import ModelSpec

REL_TOL = 1e-5  # the bound, relative to the largest logit
WORLD = 4
RUN_IDS = itertools.count()


def load(name: str, role: str = "actor") -> ModelCheckpoint:
    path = str(checkpoint(name))
    return role_checkpoint(f"models.{role}", role, read_checkpoint(f"models.{role}.checkpoint",
                                                                   path))


def tokens_for(spec: ModelSpec) -> torch.Tensor:
    return torch.randint(0, spec.vocab_size, (3, 19), generator=torch.Generator().manual_seed(5))


def rel_err(ours: np.ndarray | torch.Tensor, ref: torch.Tensor) -> float:
    ours_t = torch.as_tensor(ours)
    return float((ours_t - ref).abs().max()) / float(ref.abs().max())


def hf_logits(directory: Path | str, tokens: torch.Tensor, cls: str = "AutoModelForCausalLM",
              **kwargs: Any) -> torch.Tensor:
    import transformers

    model = getattr(transformers, cls).from_pretrained(str(directory), **kwargs).float().eval()
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=tokens).logits
    return out


def shard_bytes(spec: ModelSpec, layout: Layout, pp_rank: int, tp_rank: int, itemsize: int) -> int:
    """The bytes of a position's shard, from Megatron's shard map alone."""
    return sum(int(np.prod(s.local_shape)) * itemsize
               for s in shards_at(spec, layout, pp_rank, tp_rank))


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if owned:
        dist.destroy_process_group()


def unit_of(ck: ModelCheckpoint, spec: ModelSpec | None = None) -> tuple[Any, int]:
    """A tp=1, pp=1 unit of ``ck`` (``spec``: another architecture, a negative control),
    filled by slices; (unit, bytes read)."""
    from nereus.engines.generation import enable_kv_cache
    from nereus.hf.load import CheckpointSource
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import new_unit_state

    if spec is not None:
        ck = replace(ck, spec=spec)
    emu = Emu("actor-train", "s", Layout(1, 1), (0,))
    groups = unit_groups(emu, 0, 30.0)
    assert groups is not None
    st = new_unit_state(ck.spec, emu, 0, groups, initialize=False)
    n = CheckpointSource(ck, seed=3).fill(st)
    enable_kv_cache(st.model, groups.tp)
    return st, n


@pytest.mark.parametrize("name", [*FAMILIES, "llama31-bf16"])
def test_units_read_by_slices_give_transformers_logits(world: None, name: str) -> None:
    from nereus.runtime.worker.train import unit_logits

    ck = load(name)
    st, nbytes = unit_of(ck)
    tokens = tokens_for(ck.spec)
    ours = unit_logits(st, tokens)
    ref = hf_logits(checkpoint(name), tokens)
    assert ours is not None and ours.shape == ref.shape
    assert float(ref.abs().max()) > 1.0  # weights large enough that every tensor matters
    assert rel_err(ours, ref) <= REL_TOL
    assert nbytes == sum(int(np.prod(t.shape)) * t.itemsize for t in ck.facts.tensors)


@pytest.mark.parametrize("change", [{"rope_theta": 10000.0}, {"norm_eps": 1e-6},
                                    {"rope_scaling": None}], ids=str)
def test_a_wrong_rope_base_epsilon_or_scaling_exceeds_the_tolerance(world: None,
                                                                     change: dict[str, Any]) -> None:
    """The negative control: the same weights with Llama 2's base, another epsilon or no
    Llama-3.1 scaling give logits off by far more than the bound."""
    from nereus.runtime.worker.train import unit_logits

    ck = load("llama31")
    assert ck.spec.rope_theta == 500000.0 and ck.spec.norm_eps == 1e-5
    st, _ = unit_of(ck, replace(ck.spec, **change))
    tokens = tokens_for(ck.spec)
    ours = unit_logits(st, tokens)
    assert ours is not None
    assert rel_err(ours, hf_logits(checkpoint("llama31"), tokens)) > 10 * REL_TOL


def test_reward_and_critic_heads_read_their_scores(world: None) -> None:
    """A ``*ForSequenceClassification`` reward model's score at the last token is column 0 of
    the unit's output there; a critic on a causal LM's trunk starts with the documented value
    head (its other rows zero)."""
    from nereus.emu.hf_slices import value_head_row
    from nereus.runtime.worker.train import unit_logits

    rm = load("qwen2-reward", role="reward")
    st, _ = unit_of(rm)
    tokens = tokens_for(rm.spec)
    ours = unit_logits(st, tokens)
    ref = hf_logits(checkpoint("qwen2-reward"), tokens, "AutoModelForSequenceClassification")
    assert ours is not None and ref.shape == (3, 1)
    assert rel_err(ours[:, -1, :1], ref) <= REL_TOL
    assert not ours[..., 1:].any()
    critic = load("qwen3", role="critic")
    st, _ = unit_of(critic)
    head = dict(st.model.named_parameters())["output_layer.weight"].detach()
    assert torch.equal(head[0], torch.from_numpy(value_head_row(critic.spec.hidden_size, 3)))
    assert not head[1:].any()


# -- tp=2 and pp=2 by live transitions, on 4 gloo ranks ------------------------------------------

@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def _moves(rank: int, world: int, store: Any, directory: str, run_id: int) -> dict[str, Any]:
    """Two tp=1 replicas read from the checkpoint (ranks 0, 1) merged live into tp=2, split and
    merged into pp=2 (untied models); units read straight at tp=2 and pp=2 (ranks 2, 3)."""
    from nereus.emu.primitives import merge_node, split_node
    from nereus.hf.load import CheckpointSource
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.train import is_reporter, unit_logits

    ck = role_checkpoint("models.actor", "actor", read_checkpoint("ck", directory))
    spec, tokens = ck.spec, tokens_for(ck.spec)
    ex = TorchExecutor(spec, rank, store, f"hf{run_id}", timeout_s=60.0)
    out: dict[str, Any] = {"logits": {}, "bytes": {}}
    a, b = (Emu("actor-train", "s", Layout(1, 1), (r,)) for r in (0, 1))
    direct = [Emu("actor-train", "d", Layout(2, 1), (2, 3))]
    if not spec.tie_embeddings:  # tied embeddings run at pp=1 only (emu.shards.check_layout)
        direct.append(Emu("actor-train", "e", Layout(1, 2), (3, 2)))
    src = CheckpointSource(ck, seed=0)
    for emu in (a, b, *direct):
        ex.create(emu, initialize=False)
        if emu in ex.units:
            out["bytes"][f"{emu.state}{emu.layout.tp}{emu.layout.pp}"] = src.fill(ex.units[emu])

    def logits(emu: Emu, key: str) -> None:
        st = ex.units.get(emu)
        if st is not None:
            lg = unit_logits(st, tokens)
            if lg is not None and is_reporter(st):
                out["logits"][key] = lg.numpy()

    for emu in direct:
        logits(emu, f"direct-{emu.layout.tp}x{emu.layout.pp}")
    m = merge_node([a, b], Layout(2, 1))
    ex.merge(m)
    logits(m.into, "merged-tp2")
    if not spec.tie_embeddings:
        s = split_node(m.into, Layout(1, 1))
        ex.split(s)
        m2 = merge_node(list(s.into), Layout(1, 2))
        ex.merge(m2)
        logits(m2.into, "merged-pp2")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_live_transitions_to_tp2_and_pp2_keep_transformers_logits(pool: Any, name: str) -> None:
    ck = load(name)
    got = pool.run(_moves, str(checkpoint(name)), next(RUN_IDS))
    ref = hf_logits(checkpoint(name), tokens_for(ck.spec))
    logits: dict[str, np.ndarray] = {}
    for r in got:
        logits.update(r["logits"])
    want = {"direct-2x1", "merged-tp2"} | (set() if ck.spec.tie_embeddings else
                                           {"direct-1x2", "merged-pp2"})
    assert set(logits) == want
    for key, lg in logits.items():
        assert rel_err(lg, ref) <= REL_TOL, key
    itemsize = ck.facts.tensors[0].itemsize
    for rank, r in enumerate(got):  # each rank read its shard's bytes, counted
        for key, nbytes in r["bytes"].items():
            layout = Layout(int(key[1]), int(key[2]))
            gpus = {"s": (rank,), "d": (2, 3), "e": (3, 2)}[key[0]]
            pp_rank, tp_rank = divmod(gpus.index(rank), layout.tp)
            assert nbytes == shard_bytes(ck.spec, layout, pp_rank, tp_rank, itemsize), key
            if layout.size > 1:
                assert nbytes < shard_bytes(ck.spec, Layout(1, 1), 0, 0, itemsize)


def _export(rank: int, world: int, store: Any, directory: str, out_dir: str,
            run_id: int) -> int:
    """Units read at tp=2 (ranks 0, 1) and pp=2 (ranks 2, 3), exported untrained."""
    from nereus.emu.hf_export import export_plan
    from nereus.hf.export import DTYPES, RoleExport, write_files, write_metadata
    from nereus.hf.load import CheckpointSource
    from nereus.runtime.execution.torch_executor import TorchExecutor

    ck = role_checkpoint("models.actor", "actor", read_checkpoint("ck", directory))
    ex = TorchExecutor(ck.spec, rank, store, f"hfx{run_id}", timeout_s=60.0)
    re = RoleExport("actor", "actor-train", ck, "lm_head", DTYPES[ck.dtype])
    written = 0
    for emu in (Emu("actor-train", "a", Layout(2, 1), (0, 1)),
                Emu("actor-train", "b", Layout(1, 2), (2, 3))):
        ex.create(emu, initialize=False)
        folder = f"{out_dir}/{emu.layout.tp}x{emu.layout.pp}"
        files = export_plan(ck.spec, emu.layout, 2, 30_000)  # several files per writer
        if emu in ex.units:
            CheckpointSource(ck, 0).fill(ex.units[emu])
            n, err = write_files(ex.units[emu], files, folder, re)
            assert not err, err
            written += n
            if rank == emu.gpus[0]:
                write_metadata(folder, re, ck.spec, files, _special(), directory)
    return written


def _special() -> Any:
    from nereus.rl.tokens import SpecialTokens

    return SpecialTokens((2, 0), 0)


@pytest.mark.slow
def test_an_untrained_export_from_tp2_and_pp2_equals_the_source(pool: Any,
                                                                 tmp_path: Path) -> None:
    import json

    from safetensors import safe_open

    name = "llama31-bf16"
    src = checkpoint(name)
    for lay in ("2x1", "1x2"):
        (tmp_path / lay).mkdir()
    written = pool.run(_export, str(src), str(tmp_path), next(RUN_IDS))
    assert all(n > 0 for n in written)
    want: dict[str, torch.Tensor] = {}
    for f in src.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            want.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
    for lay in ("2x1", "1x2"):
        folder = tmp_path / lay
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        got: dict[str, torch.Tensor] = {}
        for f in sorted(set(index["weight_map"].values())):
            with safe_open(str(folder / f), framework="pt") as fh:
                got.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
        assert got.keys() == want.keys() == index["weight_map"].keys()
        for k in want:
            assert got[k].dtype == want[k].dtype == torch.bfloat16
            assert torch.equal(got[k], want[k]), (lay, k)
        assert len(set(index["weight_map"].values())) > 2  # sharded, from every writer
        for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (folder / extra).read_bytes() == (src / extra).read_bytes()
        assert json.loads((folder / "config.json").read_text()) == json.loads(
            (src / "config.json").read_text())
