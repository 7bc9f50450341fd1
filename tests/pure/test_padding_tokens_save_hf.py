"""Masks of padded batches, the text-codec seam and ``runtime.save_hf`` (pure: no process).

The masks' effect on real models (a padded row's logits, samples and losses equal the row
alone): ranks/test_hf_checkpoints.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nereus.config.load import parse_yaml
from nereus.config.run import RunConfig, parse_runtime
from nereus.config.save_hf import SaveHfOptions, parse_save_hf
from nereus.config.schema import parse_config
from nereus.engines.backend import GenRequest
from nereus.engines.masks import attention_mask, decode_mask, full_valid, positions_of
from nereus.errors import ConfigError
from nereus.rl.task import EOS, PAD, PatternTask, encode
from nereus.rl.tokens import SpecialTokens, TaskCodec, TextCodec, response_ids

VALID = torch.tensor([[False, False, True, True], [True, True, True, True]])


def test_positions_count_real_tokens_only() -> None:
    assert positions_of(VALID, 2, 4).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert positions_of(None, 2, 3).tolist() == [[0, 1, 2], [0, 1, 2]]


def test_attention_mask_is_causal_without_padded_keys_and_pad_rows_see_themselves() -> None:
    m = attention_mask(VALID)
    assert m is not None and m.shape == (2, 1, 4, 4) and m.dtype == torch.bool
    allowed = ~m[:, 0]
    assert allowed[1].tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()
    assert allowed[0].tolist() == [[True, False, False, False], [False, True, False, False],
                                   [False, False, True, False], [False, False, True, True]]
    assert attention_mask(torch.ones(3, 5, dtype=torch.bool)) is None  # no padding: no mask
    d = decode_mask(torch.tensor([[False, True, True], [True, True, True]]))
    assert d is not None and (~d[:, 0, 0]).tolist() == [[False, True, True], [True, True, True]]
    assert full_valid(VALID, 2).tolist()[0] == [False, False, True, True, True, True]


def test_gen_request_checks_and_drops_padding_for_engines_without_masks() -> None:
    prompts = torch.tensor([[0, 0, 5, 6], [4, 5, 6, 7]])
    req = GenRequest(prompts, np.arange(2), 0, 0, 4, prompt_valid=VALID, eos_ids=(1, 3))
    assert req.unpadded() == [[5, 6], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="does not match"):
        GenRequest(prompts, np.arange(2), 0, 0, 4, prompt_valid=VALID[:, :3])
    with pytest.raises(ValueError, match="EOS"):
        GenRequest(prompts, np.arange(2), 0, 0, 4, eos_ids=())


def test_the_task_codec_is_the_pattern_vocabulary_and_text_rewards_agree() -> None:
    codec = TaskCodec()
    assert isinstance(codec, TextCodec)
    assert codec.special == SpecialTokens((EOS,), PAD) and codec.ids_reward
    task = PatternTask()
    rng = np.random.default_rng(0)
    for i in range(200):
        prompt = task.prompt(i)
        ids = [int(x) for x in rng.integers(1, 8, size=int(rng.integers(0, 12)))]
        text = codec.decode(response_ids(ids, codec.special))
        assert task.reward_text(prompt, text) == task.reward(prompt, ids), (prompt, ids)
    assert response_ids([4, 5, 1, 6], SpecialTokens((1, 6), 0)) == [4, 5]
    assert codec.encode("ab:") == encode("ab:")


JOB = """
job: {algorithm: ppo, global_batch: 8, minibatches: 2, prompt_len: 8, gen_len: 8}
models: {actor: llama-3.1-8b, critic: llama-3.1-8b, reward: llama-3.1-8b}
cluster: {nodes: 1, gpus_per_node: 4, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


def _setup(algorithm: str = "ppo") -> object:
    text = JOB if algorithm == "ppo" else JOB.replace("ppo", algorithm).replace(
        "critic: llama-3.1-8b, ", "")
    return parse_config(parse_yaml(text))


def test_save_hf_options_and_their_rules() -> None:
    setup = _setup().setup  # type: ignore[attr-defined]
    got = parse_save_hf({"dir": "out", "every": 2, "roles": ["critic"]}, setup)
    assert got == SaveHfOptions("out", 2, ("actor", "critic"), 5.0)
    assert [got.due(k, 7) for k in range(8)] == [False, False, True, False, True, False, True,
                                                 True]
    assert SaveHfOptions.from_dict(got.to_dict()) == got
    assert not SaveHfOptions().due(3, 3)
    rc, _ = parse_runtime({"save_hf": {"dir": "x"}}, setup)
    assert RunConfig.from_dict(rc.to_dict()).save_hf == rc.save_hf == SaveHfOptions("x")
    bad = [({"every": 2}, "runtime.save_hf.dir"), ({"dir": ""}, "runtime.save_hf.dir"),
           ({"dir": "x", "roles": ["reward"]}, "runtime.save_hf.roles[0]"),
           ({"dir": "x", "every": -1}, "runtime.save_hf.every"),
           ({"dir": "x", "max_file_gb": 0}, "runtime.save_hf.max_file_gb"),
           ({"dir": "x", "bogus": 1}, "runtime.save_hf.bogus")]
    for raw, field in bad:
        with pytest.raises(ConfigError) as e:
            parse_save_hf(raw, setup)
        assert e.value.field == field, raw
    grpo = _setup("grpo").setup  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="grpo has no critic"):
        parse_save_hf({"dir": "x", "roles": ["critic"]}, grpo)
    tiny = parse_config(parse_yaml(JOB.replace("llama-3.1-8b", "tiny-gpt"))).setup
    with pytest.raises(ConfigError, match=r"cannot be exported: .*learned absolute"):
        parse_save_hf({"dir": "x"}, tiny)


def test_a_checkpoint_needs_the_file_layer_and_takes_no_architecture_keys() -> None:
    raw = parse_yaml(JOB.replace("actor: llama-3.1-8b", "actor: {checkpoint: /nowhere}"))
    with pytest.raises(ConfigError, match="read by the config loader") as e:
        parse_config(raw)
    assert e.value.field == "models.actor.checkpoint"
    raw = parse_yaml(JOB.replace("actor: llama-3.1-8b",
                                 "actor: {checkpoint: /nowhere, num_layers: 2}"))
    with pytest.raises(ConfigError, match=r"comes from its config\.json") as e:
        parse_config(raw)
    assert e.value.field == "models.actor.num_layers"
