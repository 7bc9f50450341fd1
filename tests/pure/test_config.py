"""Tier 1 (pure): YAML job configs → checked specs; every malformed config is one ConfigError."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.config import Config, load_config, parse_config, parse_yaml
from nereus.config.cluster import CLUSTER_KEYS
from nereus.config.job import CONTROLLER_KEYS, JOB_KEYS
from nereus.config.models import ARCH_KEYS
from nereus.errors import ConfigError
from nereus.spec.hardware import GPU_PRESETS, ClusterSpec, GpuSpec
from nereus.spec.job import ControllerSpec, JobSpec, PlanSpace
from nereus.spec.model import MODEL_PRESETS, ModelSpec

# the space nereus run searched before issue 37: pp dividing the layers, dp the batch
EVEN_SPACE = PlanSpace(pipeline="even", uneven_dp=False)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

BASE: dict[str, Any] = {
    "job": {"algorithm": "ppo", "global_batch": 64, "prompt_len": 512, "gen_len": 1024},
    "models": {"actor": "llama-3.1-8b", "critic": "llama-3.1-8b", "reward": "llama-3.1-8b"},
    "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "h200"},
    "controller": {"gamma": 0.5},
}
ARCH: dict[str, Any] = {
    "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
    "num_kv_heads": 2, "vocab_size": 100,
}


def with_(path: str, value: Any, base: dict[str, Any] = BASE) -> dict[str, Any]:
    """A deep copy of ``base`` with the dotted ``path`` set to ``value``."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


def without(path: str, base: dict[str, Any] = BASE) -> dict[str, Any]:
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    del node[last]
    return data


def error_of(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value


def test_base_config_gives_the_setup() -> None:
    setup = parse_config(BASE).setup
    assert setup.cluster == ClusterSpec(2, 8, GPU_PRESETS["h200"])
    job = setup.job
    assert (job.algorithm, job.mode, job.global_batch, job.prompt_len, job.gen_len) == (
        "ppo", "sync", 64, 512, 1024,
    )
    assert [role for role, _ in job.models] == ["actor", "critic", "reward", "reference"]
    assert job.model("reference") == MODEL_PRESETS["llama-3.1-8b"]  # defaults to the actor
    assert job.controller == ControllerSpec(gamma=0.5)
    assert len(job.workflow.names) == 6


def test_defaults_of_an_almost_empty_config() -> None:
    setup = parse_config({"models": {"actor": "qwen3-14b", "critic": "qwen3-14b",
                                     "reward": "qwen3-14b"}, "cluster": {"gpu": "cpu"}}).setup
    job = setup.job
    assert (job.algorithm, job.mode, job.global_batch, job.samples_per_prompt) == (
        "ppo", "sync", 256, 1,
    )
    assert (job.prompt_len, job.gen_len, job.gen_len_p95, job.minibatches) == (1024, 2048, 0, 1)
    with pytest.raises(ConfigError, match="max_seq_len=256"):  # tiny-gpt cannot hold 3072 tokens
        parse_config({"models": {"actor": "tiny-gpt", "critic": "tiny-gpt", "reward": "tiny-gpt"},
                      "cluster": {"gpu": "cpu"}})
    assert setup.cluster.num_gpus == 8 and setup.cluster.nodes == 1


def test_grpo_defaults_to_groups_of_eight_and_needs_no_critic() -> None:
    data = {"job": {"algorithm": "grpo", "reward_model": False},
            "models": {"actor": "qwen3-14b"}, "cluster": {"gpu": "mi250x-gcd", "nodes": 4}}
    job = parse_config(data).setup.job
    assert job.samples_per_prompt == 8
    assert [r for r, _ in job.models] == ["actor", "reference"]
    assert "critic-train" not in job.workflow.names and "reward-inf" not in job.workflow.names


def test_gpu_overrides_convert_units_and_keep_the_preset_name() -> None:
    data = with_("cluster", {"gpu": "cpu", "nodes": 2, "gpus_per_node": 4,
                             "memory_per_gpu_gb": 0.5, "peak_tflops": 0.2, "inter_node_gbps": 3})
    gpu = parse_config(data).setup.cluster.gpu
    assert gpu == dataclasses.replace(GPU_PRESETS["cpu"], memory_bytes=500_000_000,
                                      peak_flops=0.2e12, inter_node_gbps=3.0)


def test_architecture_mapping_and_preset_base() -> None:
    data = with_("models.reward", {"preset": "llama-3.1-8b", "name": "rm", "num_layers": 16})
    data = with_("models.critic", dict(ARCH, name="small-critic", head_dim=32), data)
    job = parse_config(data).setup.job
    assert job.model("reward") == dataclasses.replace(
        MODEL_PRESETS["llama-3.1-8b"], name="rm", num_layers=16
    )
    assert job.model("critic") == ModelSpec(name="small-critic", head_dim=32, **ARCH)
    assert ModelSpec(name="x", **ARCH).kv_channels == 16


def test_extension_sections_pass_through_read_only() -> None:
    config = parse_config(with_("runtime", {"backend": "gloo", "anything": [1, 2]}))
    assert isinstance(config, Config)
    runtime = config.section("runtime")
    assert runtime is not None and runtime["backend"] == "gloo"
    with pytest.raises(TypeError):
        runtime["backend"] = "nccl"  # type: ignore[index]
    assert parse_config(BASE).section("runtime") is None
    assert parse_config(with_("sim", {"x": 1}), extensions=("runtime", "sim")).section("sim")
    assert error_of(with_("sim", {"x": 1})).field == "sim"


# (data, field, a fragment of the rule): every one is a single ConfigError naming the field.
MALFORMED: list[tuple[str, Any, str, str]] = [
    ("top-level list", [1, 2], "config", "must be a mapping"),
    ("top-level string", "ppo", "config", "must be a mapping"),
    ("empty document", None, "config", "must be a mapping"),
    ("unknown section", with_("jobs", {}), "jobs", "did you mean 'job'"),
    ("missing models", without("models"), "models", "missing"),
    ("missing cluster", without("cluster"), "cluster", "missing"),
    ("section not a mapping", with_("job", [1]), "job", "must be a mapping"),
    ("empty section", with_("cluster", None), "cluster", "must be a mapping"),
    ("unknown job key", with_("job.batch", 8), "job.batch", "allowed: algorithm"),
    ("unknown cluster key", with_("cluster.gpu_per_node", 8), "cluster.gpu_per_node",
     "did you mean 'gpus_per_node'"),
    ("non-string key", with_("cluster", {**BASE["cluster"], 7: 8}), "cluster.7",
     "keys must be strings"),
    ("zero gpus per node", with_("cluster.gpus_per_node", 0), "cluster.gpus_per_node",
     "must be a positive integer"),
    ("bool is not int", with_("cluster.nodes", True), "cluster.nodes", "positive integer"),
    ("float is not int", with_("cluster.nodes", 2.0), "cluster.nodes", "positive integer"),
    ("string is not int", with_("job.global_batch", "64"), "job.global_batch", "positive integer"),
    ("negative batch", with_("job.global_batch", -4), "job.global_batch", "positive integer"),
    ("empty value", with_("job.gen_len", None), "job.gen_len", "positive integer"),
    ("negative p95", with_("job.gen_len_p95", -1), "job.gen_len_p95", "non-negative integer"),
    ("p95 below mean", with_("job.gen_len_p95", 512), "job.gen_len_p95", "at least gen_len=1024"),
    ("unknown algorithm", with_("job.algorithm", "dpo"), "job.algorithm",
     "one of ppo, grpo, remax"),
    ("unknown mode", with_("job.mode", "overlap"), "job.mode", "one of sync, async"),
    ("reward_model not bool", with_("job.reward_model", "yes"), "job.reward_model",
     "true or false"),
    ("bad dtype", with_("job.dtype_bytes", 3), "job.dtype_bytes", "2 (bf16/fp16) or 4"),
    ("minibatches do not divide", with_("job.minibatches", 3), "job.minibatches",
     "must divide global_batch × samples_per_prompt = 64"),
    ("grpo group of one", with_("job.samples_per_prompt", 1, with_("job.algorithm", "grpo",
     without("models.critic"))), "job.samples_per_prompt", "at least 2"),
    ("too long for the model", with_("job.gen_len", 200_000), "job.gen_len",
     "exceeds max_seq_len=131072 of models.actor"),
    ("unknown gpu preset", with_("cluster.gpu", "h100"), "cluster.gpu",
     "allowed: h200, a100-64gb, a100-80gb, h100-80gb, mi250x-gcd, mi300x, cpu"),
    ("missing gpu", without("cluster.gpu"), "cluster.gpu", "missing"),
    ("gpu not a string", with_("cluster.gpu", {"name": "h200"}), "cluster.gpu",
     "unknown GPU preset"),
    ("zero memory", with_("cluster.memory_per_gpu_gb", 0), "cluster.memory_per_gpu_gb",
     "positive number"),
    ("infinite bandwidth", with_("cluster.inter_node_gbps", float("inf")),
     "cluster.inter_node_gbps", "positive number"),
    ("nan flops", with_("cluster.peak_tflops", float("nan")), "cluster.peak_tflops",
     "positive number"),
    ("unknown model preset", with_("models.actor", "llama-8b"), "models.actor",
     "did you mean 'llama-3.1-8b'"),
    ("unknown role", with_("models.policy", "tiny-gpt"), "models.policy",
     "allowed: actor, critic, reward, reference"),
    ("missing actor", without("models.actor"), "models.actor", "missing"),
    ("ppo without critic", without("models.critic"), "models.critic", "ppo needs a critic"),
    ("critic for grpo", with_("job.algorithm", "grpo"), "models.critic", "grpo has no critic"),
    ("critic for remax", with_("job.algorithm", "remax"), "models.critic", "remax has no critic"),
    ("missing reward", without("models.reward"), "models.reward", "reward_model is true"),
    ("reward without reward model", with_("job.reward_model", False), "models.reward",
     "reward_model is false"),
    ("heads do not divide hidden", with_("models.actor", dict(ARCH, num_attention_heads=6,
     num_kv_heads=2)), "models.actor.num_attention_heads", "must divide hidden_size=64"),
    ("kv heads do not divide heads", with_("models.actor", dict(ARCH, num_kv_heads=3)),
     "models.actor.num_kv_heads", "must divide num_attention_heads=4"),
    ("architecture missing a field", with_("models.actor", without("vocab_size", ARCH)),
     "models.actor.vocab_size", "missing"),
    ("unknown architecture key", with_("models.actor", dict(ARCH, layers=4)),
     "models.actor.layers", "did you mean 'num_layers'"),
    ("bad norm", with_("models.actor", dict(ARCH, norm="batchnorm")), "models.actor.norm",
     "rmsnorm, layernorm"),
    ("bad preset base", with_("models.critic", {"preset": "gpt-5"}), "models.critic.preset",
     "unknown model preset"),
    ("zero layers", with_("models.reward", {"preset": "tiny-gpt", "num_layers": 0}),
     "models.reward.num_layers", "positive integer"),
    ("headroom of one", with_("controller.memory_headroom", 1.0), "controller.memory_headroom",
     "in [0, 1)"),
    ("negative headroom", with_("controller.memory_headroom", -0.1),
     "controller.memory_headroom", "in [0, 1)"),
    ("negative gamma", with_("controller.gamma", -0.5), "controller.gamma", "≥ 0"),
    ("zero delta", with_("controller.delta_len", 0), "controller.delta_len", "positive number"),
    ("alpha zero", with_("controller.calibration_alpha", 0.0), "controller.calibration_alpha",
     "in (0, 1]"),
    ("unknown controller key", with_("controller.delta", 0.3), "controller.delta",
     "allowed: delta_len"),
    ("runtime not a mapping", with_("runtime", "fast"), "runtime", "must be a mapping"),
]


@pytest.mark.parametrize(("data", "field", "rule"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_config_names_field_value_and_rule(data: Any, field: str, rule: str) -> None:
    exc = error_of(data)
    assert exc.field == field
    assert rule in exc.rule
    line = str(exc)
    assert "\n" not in line and line.startswith(f"{field}=")


def test_there_are_enough_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


# Malformed files: YAML-level problems reach the user as one line naming the file.
BAD_FILES = [
    ("not yaml", "job: [1, 2\n", "not valid YAML"),
    ("tab indentation", "job:\n\talgorithm: ppo\n", "not valid YAML"),
    ("two documents", "job: {}\n---\njob: {}\n", "but found another document"),
    ("duplicate key", "cluster:\n  nodes: 2\n  nodes: 4\n", "duplicate key at line 3"),
    ("list document", "- job\n- models\n", "is a list; must be a YAML mapping"),
    ("empty file", "", "is empty; must be a YAML mapping"),
    ("bad mapping value", "job:\n  algorithm: ppo: sync\n", "mapping values are not allowed"),
]


@pytest.mark.parametrize(("text", "rule"), [b[1:] for b in BAD_FILES],
                         ids=[b[0] for b in BAD_FILES])
def test_malformed_file(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert rule in info.value.rule and "\n" not in str(info.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(binary))
    duplicate = "models:\n  actor: tiny-gpt\n  actor: tiny-gpt\n"
    with pytest.raises(ConfigError) as info:
        parse_yaml(duplicate)
    assert info.value.field == "models.actor"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_passes(path: Path) -> None:
    from nereus.spec.hardware import GPU_PRESETS

    # cluster.gpu: auto (examples/grpo-tiny-gpu.yaml) stands for the node's GPU: an H200 here
    setup = load_config(str(path), detect_gpu=lambda: GPU_PRESETS["h200"]).setup
    assert setup.cluster.num_gpus >= 8 and setup.job.workflow.names[0] == "actor-gen"


def test_the_examples_the_readme_promises_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"ppo-llama8b-h200.yaml", "grpo-qwen3-14b-mi250x.yaml", "remax-llama8b-a100.yaml",
            "ppo-tiny-cpu.yaml"} <= names
    setup = load_config(str(ROOT / "examples" / "ppo-llama8b-h200.yaml")).setup
    assert (setup.cluster.num_gpus, setup.cluster.nodes, setup.job.gen_len) == (64, 8, 4096)
    assert setup.job.model("actor").name == "llama-3.1-8b"


def test_plan_space_and_memory_keys_reach_the_job() -> None:
    base = {"models": {"actor": "llama-3.1-8b", "critic": "llama-3.1-8b",
                       "reward": "llama-3.1-8b"},
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100-80gb"}}
    job = parse_config(base).setup.job
    assert (job.space, job.flash_attention, job.distributed_optimizer) == (PlanSpace(), True, False)
    job = parse_config({**base, "job": {"pipeline_split": "even", "uneven_dp": False,
                                        "flash_attention": False,
                                        "distributed_optimizer": True}}).setup.job
    assert job.space == EVEN_SPACE and not job.flash_attention and job.distributed_optimizer
    with pytest.raises(ConfigError) as exc:
        parse_config({**base, "job": {"pipeline_split": "odd"}})
    assert exc.value.field == "job.pipeline_split"


def test_schema_keys_cover_the_spec_fields_and_the_docs() -> None:
    assert set(ARCH_KEYS) - {"preset"} == {f.name for f in dataclasses.fields(ModelSpec)}
    # the plan space (JobSpec.space) is given as two flat keys
    assert set(JOB_KEYS) == ({f.name for f in dataclasses.fields(JobSpec)}
                             - {"models", "controller", "space"}) | {"pipeline_split", "uneven_dp"}
    assert set(CONTROLLER_KEYS) == {f.name for f in dataclasses.fields(ControllerSpec)}
    assert {"name", "vendor", "memory_bytes", "peak_flops"} <= {
        f.name for f in dataclasses.fields(GpuSpec)
    }
    docs = (ROOT / "docs" / "config.md").read_text()
    for key in (*ARCH_KEYS, *JOB_KEYS, *CONTROLLER_KEYS, *CLUSTER_KEYS):
        assert re.search(rf"\| `{key}` \|", docs), f"docs/config.md lacks a row for {key}"


# ---- properties -------------------------------------------------------------------------------

def _valid_configs() -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        algorithm = draw(st.sampled_from(["ppo", "grpo", "remax"]))
        reward_model = draw(st.booleans())
        samples = draw(st.integers(2, 16)) if algorithm == "grpo" else draw(st.integers(1, 4))
        batch = draw(st.integers(1, 512))
        divisors = [d for d in range(1, 9) if (batch * samples) % d == 0]
        preset = draw(st.sampled_from(["llama-3.1-8b", "qwen3-14b", "qwen3-32b", "llama-3.3-70b"]))
        models = {"actor": preset}
        if algorithm == "ppo":
            models["critic"] = preset
        if reward_model:
            models["reward"] = draw(st.sampled_from(["llama-3.1-8b", "qwen3-14b"]))
        gen_len = draw(st.integers(1, 16384))
        return {
            "job": {
                "algorithm": algorithm, "mode": draw(st.sampled_from(["sync", "async"])),
                "global_batch": batch, "samples_per_prompt": samples,
                "minibatches": draw(st.sampled_from(divisors)),
                "prompt_len": draw(st.integers(1, 4096)), "gen_len": gen_len,
                "gen_len_p95": draw(st.sampled_from([0, gen_len, gen_len + 100])),
                "reward_model": reward_model,
            },
            "models": models,
            "cluster": {
                "nodes": draw(st.integers(1, 128)), "gpus_per_node": draw(st.integers(1, 8)),
                "gpu": draw(st.sampled_from(sorted(GPU_PRESETS))),
                "memory_per_gpu_gb": draw(st.floats(0.5, 512)),
            },
            "controller": {
                "gamma": draw(st.floats(0, 10)),
                "memory_headroom": draw(st.floats(0, 0.99)),
            },
        }

    return build()


@settings(max_examples=60, deadline=None)
@given(_valid_configs())
def test_valid_configs_load_to_exactly_their_values(data: dict[str, Any]) -> None:
    setup = parse_config(data).setup
    job, cluster = setup.job, setup.cluster
    for key, value in data["job"].items():
        assert getattr(job, key) == value
    assert dict(job.models) == {
        **{role: MODEL_PRESETS[name] for role, name in data["models"].items()},
        "reference": MODEL_PRESETS[data["models"]["actor"]],
    }
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpu.name) == (
        data["cluster"]["nodes"], data["cluster"]["gpus_per_node"], data["cluster"]["gpu"],
    )
    assert cluster.gpu.memory_bytes == round(data["cluster"]["memory_per_gpu_gb"] * 1e9)
    assert job.controller.gamma == data["controller"]["gamma"]
    assert parse_config(copy.deepcopy(data)) == parse_config(data)  # deterministic


# Leaves whose value, replaced by any of BAD_VALUES, must be rejected under exactly that name.
POSITIVE_INT_LEAVES = ["job.global_batch", "job.prompt_len", "job.gen_len", "cluster.nodes",
                       "cluster.gpus_per_node"]
BAD_VALUES = [0, -1, True, False, 1.5, "8", None, [8], {"n": 8}]


@settings(max_examples=80, deadline=None)
@given(_valid_configs(), st.sampled_from(POSITIVE_INT_LEAVES), st.sampled_from(BAD_VALUES))
def test_a_bad_leaf_is_reported_under_its_own_name(
    data: dict[str, Any], leaf: str, bad: Any
) -> None:
    exc = error_of(with_(leaf, bad, data))
    assert exc.field == leaf and exc.value == bad


_yamlish = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True)
    | st.sampled_from(["ppo", "h200", "tiny-gpt", "job", "models", "cluster", "actor", "gpu"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(["job", "models", "cluster", "controller", "runtime", "actor", "critic",
                         "gpu", "nodes", "algorithm", "x"]), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(_yamlish)
def test_arbitrary_data_never_raises_anything_but_config_error(data: Any) -> None:
    try:
        parse_config(data)
    except ConfigError as exc:
        assert "\n" not in str(exc)
