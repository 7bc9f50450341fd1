"""The vLLM engine and ``runtime.generation``.

MOCK: vLLM cannot be installed or run on these CPU-only machines, so the adapter is exercised
against a *test double* of the ``vllm`` module (``FakeVllm`` below, injected through
``sys.modules``; CUDA is faked by patching ``torch.cuda.is_available``). These tests check the
calls the adapter makes — the ``LLM`` construction arguments and the generated config, the
per-request ``SamplingParams`` (seeds by global sample index, greedy), the conversion of
``RequestOutput``s, and that a weight refresh hands ``load_weights`` exactly the converted
Hugging Face names, shapes and values — not vLLM's behaviour. The config check and the
one-line failure without vLLM/CUDA are real.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
import yaml

from nereus.emu.hf_layout import hf_shapes, to_hf
from nereus.emu.shards import tensor_specs
from nereus.engines.backend import GenerationEngine, GenRequest
from nereus.engines.vllm_engine import (
    EnginePlacementError,
    VllmEngine,
    VllmUnavailable,
    check_vllm_placement,
    outputs_to_generated,
    request_seed,
    vllm_unavailable_reason,
)
from nereus.errors import ConfigError
from nereus.rl.task import EOS, PAD
from nereus.spec.model import ModelSpec
from nereus.spec.plan import StagePlan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ppo-tiny-cpu.yaml"
SPEC = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=32, ffn_hidden_size=64,
                 num_attention_heads=4, num_kv_heads=2, vocab_size=8, max_seq_len=64)


# -- MOCK: a test double of the vllm module ----------------------------------------------------

class FakeSamplingParams:
    """MOCK of ``vllm.SamplingParams``: keeps its keyword arguments."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw


def _completion(ids: list[int], lps: list[float]) -> Any:
    """MOCK of a ``RequestOutput`` with one ``CompletionOutput``."""
    logprobs = [{t: types.SimpleNamespace(logprob=lp, rank=1)} for t, lp in
                zip(ids, lps, strict=True)]
    return types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids,
                                                                logprobs=logprobs)])


class FakeModel:
    """MOCK of vLLM's in-process model: records what ``load_weights`` consumed."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, tuple[int, ...], np.ndarray]] = []

    def load_weights(self, weights: Any) -> set[str]:
        assert not isinstance(weights, (list, dict))  # streamed, one tensor at a time
        for name, t in weights:
            assert isinstance(t, torch.Tensor)
            self.loaded.append((name, tuple(t.shape), t.numpy().copy()))
        return {n for n, _, _ in self.loaded}


class FakeLLM:
    """MOCK of ``vllm.LLM``: records its arguments, the config it was pointed at and every
    ``generate`` call; answers with scripted outputs."""

    instances: ClassVar[list[FakeLLM]] = []
    script: ClassVar[list[tuple[list[int], list[float]]]] = []

    def __init__(self, **kw: Any) -> None:
        self.kw = kw
        self.config = json.loads((Path(kw["model"]) / "config.json").read_text())
        self.env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING")}
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.model = FakeModel()
        cache = types.SimpleNamespace(num_gpu_blocks=10, block_size=16)
        self.llm_engine = types.SimpleNamespace(
            vllm_config=types.SimpleNamespace(cache_config=cache))
        FakeLLM.instances.append(self)

    def generate(self, prompts: list[Any], sampling_params: list[Any],
                 use_tqdm: bool = True) -> list[Any]:
        assert use_tqdm is False and len(prompts) == len(sampling_params)
        self.calls.append((prompts, sampling_params))
        return [_completion(*self.script[i % len(self.script)]) for i in range(len(prompts))]

    def apply_model(self, func: Any) -> list[Any]:
        return [func(self.model)]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeLLM]:
    """MOCK: vLLM 'installed' (a double in sys.modules) and CUDA 'available'."""
    mod = types.ModuleType("vllm")
    mod.LLM = FakeLLM  # type: ignore[attr-defined]
    mod.SamplingParams = FakeSamplingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for k in ("RANK", "LOCAL_RANK", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(k, "unset")  # restored after the test
    FakeLLM.instances = []
    FakeLLM.script = [([5, 6, EOS], [-0.5, -0.25, -1.0]), ([7, 7, 7, 7], [-0.1] * 4)]
    return FakeLLM


def _glob(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.global_shape).astype(np.float32)
            for t in tensor_specs(SPEC)}


def _engine(tp: int = 2, params: Any = None) -> VllmEngine:
    return VllmEngine(SPEC, tp=tp, params=params or (lambda: _glob(0)), max_model_len=24,
                      seed=7, rank=3, local_rank=1, dtype="bfloat16")


def test_mock_llm_is_built_tokenizer_free_with_dummy_weights_and_the_plans_tp(
        fake_vllm: type[FakeLLM]) -> None:
    engine = _engine(tp=2)
    assert isinstance(engine, GenerationEngine) and engine.name == "vllm"
    llm = fake_vllm.instances[-1]
    assert llm.kw["skip_tokenizer_init"] is True and llm.kw["load_format"] == "dummy"
    assert llm.kw["tensor_parallel_size"] == 2
    assert llm.kw["distributed_executor_backend"] == "external_launcher"
    assert llm.kw["logprobs_mode"] == "processed_logprobs"
    assert llm.kw["max_model_len"] == 24 and llm.kw["seed"] == 7
    assert llm.kw["dtype"] == "bfloat16" and llm.kw["enable_prefix_caching"] is False
    assert llm.env == {"RANK": "3", "LOCAL_RANK": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cfg = llm.config
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    assert cfg["eos_token_id"] == EOS and cfg["pad_token_id"] == PAD
    assert cfg["vocab_size"] == 8 and cfg["head_dim"] == 8 and cfg["tie_word_embeddings"] is False
    # KV cache: 10 blocks × 16 tokens × (K and V) × 2 layers × 1 kv head per tp rank × 8 × 2 B
    assert engine.kv_cache_bytes() == 10 * 16 * 2 * 2 * 1 * 8 * 2
    model_dir = Path(llm.kw["model"])
    engine.close()
    assert not model_dir.exists()


def test_mock_sampling_params_are_seeded_by_global_sample_index(
        fake_vllm: type[FakeLLM]) -> None:
    engine = _engine()
    prompts = torch.tensor([[0, 3, 4, 2], [0, 0, 5, 2], [3, 4, 5, 2], [0, 6, 7, 2]])
    ids = np.arange(10, 14)
    whole = engine.sampling_params(GenRequest(prompts, ids, seed=7, step=3, max_new_tokens=6,
                                              temperature=0.8))
    assert [p.kw["seed"] for p in whole] == [request_seed(7, 3, i) for i in range(10, 14)]
    assert len({p.kw["seed"] for p in whole}) == 4
    for p in whole:
        assert p.kw["temperature"] == 0.8 and p.kw["max_tokens"] == 6 and p.kw["n"] == 1
        assert p.kw["logprobs"] == 0 and p.kw["stop_token_ids"] == [EOS]
        assert p.kw["detokenize"] is False
    # two replicas each taking half: every row gets the parameters it had in the whole batch
    halves = [engine.sampling_params(GenRequest(prompts[a:b], ids[a:b], 7, 3, 6, 0.8))
              for a, b in ((0, 2), (2, 4))]
    assert [p.kw for h in halves for p in h] == [p.kw for p in whole]
    assert request_seed(7, 4, 10) != request_seed(7, 3, 10) != request_seed(8, 3, 10)
    greedy = engine.sampling_params(GenRequest(prompts, ids, 7, 3, 6, 0.8, greedy=True))
    assert {p.kw["temperature"] for p in greedy} == {0.0}
    # generate sends the token ids themselves (left padding included) with those params
    out = engine.generate(GenRequest(prompts, ids, 7, 3, 6, 0.8, greedy=True))
    sent, params = fake_vllm.instances[-1].calls[-1]
    assert sent == [{"prompt_token_ids": row} for row in prompts.tolist()]
    assert [p.kw for p in params] == [p.kw for p in greedy]
    assert out.tokens.shape == (4, 10) and out.kv_cache_bytes == engine.kv_cache_bytes()


def test_mock_request_outputs_become_generated() -> None:
    prompts = torch.tensor([[0, 3, 2], [4, 5, 2], [0, 0, 2]])
    outs = [_completion([5, 6, EOS], [-0.5, -0.25, -1.0]),  # stopped at EOS
            _completion([7, 7, 7, 7, 7], [-0.1] * 5),  # hit max_tokens
            _completion([EOS, 3], [-2.0, -0.3])]  # anything after EOS does not count
    g = outputs_to_generated(prompts, outs, 5, kv_bytes=123)
    assert g.tokens.tolist() == [[0, 3, 2, 5, 6, EOS, PAD, PAD], [4, 5, 2, 7, 7, 7, 7, 7],
                                 [0, 0, 2, EOS, PAD, PAD, PAD, PAD]]
    assert g.mask.tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]]
    assert g.logp.tolist() == [[-0.5, -0.25, -1.0, 0, 0], [-0.1] * 5, [-2.0, 0, 0, 0, 0]]
    assert g.logp.dtype == torch.float64 and g.kv_cache_bytes == 123
    with pytest.raises(Exception, match="6 tokens for max_tokens=5"):
        outputs_to_generated(prompts[:1], [_completion([3] * 6, [0.0] * 6)], 5, 0)
    with pytest.raises(Exception, match="2 outputs for 3 prompts"):
        outputs_to_generated(prompts, outs[:2], 5, 0)


def test_mock_weight_refresh_hands_load_weights_exactly_the_converted_tensors(
        fake_vllm: type[FakeLLM]) -> None:
    versions = iter([_glob(1), _glob(2)])
    engine = _engine(params=lambda: next(versions))
    model = fake_vllm.instances[-1].model
    for seed in (1, 2):  # each refresh reads the unit's weights anew
        model.loaded.clear()
        moved = engine.refresh_weights()
        want = to_hf(SPEC, _glob(seed))
        assert [(n, s) for n, s, _ in model.loaded] == list(hf_shapes(SPEC).items())
        for name, _, arr in model.loaded:
            assert np.array_equal(arr, want[name]), name
        assert moved == sum(a.nbytes for a in want.values())


def test_without_vllm_or_cuda_the_engine_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    reason = vllm_unavailable_reason()
    assert reason is not None and "vllm package is not installed" in reason
    with pytest.raises(VllmUnavailable) as e:
        _engine()
    assert str(e.value).count("\n") == 0 and "runtime.generation=vllm" in str(e.value)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # MOCK: vllm present
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in (vllm_unavailable_reason() or "")


def test_vllm_placement_needs_aligned_tp_blocks_over_the_world_at_pp_1() -> None:
    def plan(tp: int, pp: int, replicas: tuple[tuple[int, ...], ...]) -> StagePlan:
        return StagePlan("actor-gen", tp, pp, len(replicas), 1, 1, replicas=replicas)

    check_vllm_placement(plan(2, 1, ((2, 3), (1, 0))), 4)
    check_vllm_placement(plan(1, 1, ((0,), (1,))), 2)
    with pytest.raises(EnginePlacementError, match="pp=2"):
        check_vllm_placement(plan(1, 2, ((0, 1),)), 2)
    with pytest.raises(EnginePlacementError, match="aligned blocks of tp=2"):
        check_vllm_placement(plan(2, 1, ((1, 2), (0, 3))), 4)
    with pytest.raises(EnginePlacementError, match="aligned blocks"):
        check_vllm_placement(plan(2, 1, ((0, 1),)), 4)  # ranks 2, 3 would not build vLLM


# -- runtime.generation (real config checks) ---------------------------------------------------

def _parse(runtime: dict[str, Any]) -> Any:
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime

    cfg = load_config(str(EXAMPLE))
    return parse_runtime(runtime, cfg.setup)


def test_generation_defaults_to_megatron_and_rejects_unknown_engines() -> None:
    """The default is ``auto``: Megatron-core on CPU ranks (vLLM on GPUs where it imports:
    tests/test_device_config.py)."""
    from nereus.config.run import RunConfig, resolve_generation

    rc, setup = _parse({})
    assert rc.generation == "auto"
    assert resolve_generation(rc.generation, False, False, setup)[0] == "megatron"
    assert RunConfig.from_dict(rc.to_dict()) == rc
    with pytest.raises(ConfigError, match="must be one of auto, megatron, vllm") as e:
        _parse({"generation": "tensorrt"})
    assert e.value.field == "runtime.generation"


def test_generation_vllm_fails_the_runtime_check_here_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The config itself is valid here (it names a Llama-family actor or not: checked by the
    parser); that vLLM and a CUDA device are missing is the runtime's check before any rank."""
    from nereus.engines.vllm_engine import require_vllm

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with pytest.raises(ConfigError) as e:
        require_vllm("vllm")
    assert e.value.field == "runtime.generation"
    assert "needs vLLM on CUDA GPUs, but the vllm package is not installed" in str(e.value)


def test_generation_vllm_rejects_a_learned_position_actor(fake_vllm: type[FakeLLM]) -> None:
    with pytest.raises(ConfigError, match="learned absolute position embeddings"):
        _parse({"generation": "vllm"})  # MOCK vLLM present; the example's tiny-gpt is not Llama


def test_nereus_run_with_vllm_is_one_line_exit_2_before_any_rank(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nereus.cli import main

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["runtime"]["generation"] = "vllm"
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump(raw))
    log = tmp_path / "run.h5"
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpiexec: the config must fail first
    assert main(["run", str(path), "--log", str(log)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    # the example's actor has learned positions (not Llama): the config's own error comes first
    assert err.startswith("nereus: error: runtime.generation='vllm': model 'tiny-task' has "
                          "learned absolute position embeddings")
    assert not log.exists()
