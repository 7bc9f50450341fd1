"""A job's prompts, tokenizer and reward (nereus.rl.data, nereus.rl.rewards, nereus.rl.inputs):
tokenization and chat templates equal transformers' own, jsonl and parquet give the same
batches, bad files are one-line errors, the sample order takes every row once per epoch, user
reward functions load and fail as documented, and the shipped pattern task is what its
generator writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.hf_tokenizer import write_tokenizer

from nereus.config.data import DataOptions, RewardOptions, parse_data, parse_reward
from nereus.errors import ConfigError
from nereus.rl.data.dataset import read_prompts
from nereus.rl.data.identity import data_identity
from nereus.rl.data.tokenizer import load_tokenizer
from nereus.rl.rewards.loader import load_reward
from nereus.rl.rewards.scoring import RewardError, ScoreItem, Scorer, probe
from nereus.rl.sample_order import SampleOrder

PROMPTS = ["How many clips did Natalia sell?", "Compute 3/4 of 1,200.",
           "Weng earns $12 an hour. How much for 50 minutes?", "What is -5 + 2?"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"prompt": PROMPTS[i % len(PROMPTS)] + f" ({i})", "answer": str(i), "id": i}
            for i in range(n)]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _opts(**kw: Any) -> DataOptions:
    return DataOptions(**{"train": "x.jsonl", "tokenizer": "t", "max_prompt_len": 64, **kw})


# ---- tokenizer ----


@pytest.mark.parametrize("template", [False, True])
def test_prompt_ids_equal_transformers(hf_dir: Path, template: bool) -> None:
    from transformers import AutoTokenizer

    codec = load_tokenizer(str(hf_dir), "data.tokenizer", template)
    ref = AutoTokenizer.from_pretrained(str(hf_dir))
    got = codec.encode_all(PROMPTS)
    for prompt, ids in zip(PROMPTS, got, strict=True):
        if template:
            want = ref.apply_chat_template([{"role": "user", "content": prompt}],
                                           add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
            assert ref.decode(ids).startswith("<|im_start|>user\n")
        else:
            want = ref(prompt)["input_ids"]
        assert ids == list(want)
    # a list of messages goes through the template as it is
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[0]}]
    if template:
        assert codec.encode(chat) == list(ref.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False))
        assert codec.prompt_text(chat) == ref.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False)


def test_eos_pad_and_decoding(hf_dir: Path, tmp_path: Path) -> None:
    codec = load_tokenizer(str(hf_dir), "data.tokenizer", True)
    im_end = codec.tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = codec.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert codec.special.eos_ids == (im_end,) and codec.special.pad_id == pad
    assert codec.eos_ids == (im_end,) and codec.pad_id == pad
    ids = codec.encode("The answer is 72")[-4:]
    resp = [*ids, im_end, *ids, pad]  # text after the first EOS is not the response
    assert codec.response_ids(resp) == ids
    assert codec.decode(codec.response_ids(resp)) == codec.tokenizer.decode(ids)
    # a checkpoint folder's generation_config.json names its EOS ids first
    other = write_tokenizer(tmp_path / "ckpt", generation_eos=[pad, im_end])
    assert load_tokenizer(str(other), "models.actor.checkpoint", False).eos_ids == (pad, im_end)


def test_tokenizer_errors(hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        load_tokenizer(str(tmp_path / "nope"), "data.tokenizer", False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json"):
        load_tokenizer(str(tmp_path / "empty"), "data.tokenizer", False)
    plain = write_tokenizer(tmp_path / "plain", chat_template=False)
    with pytest.raises(ConfigError, match=r"data\.chat_template=True: the tokenizer in .* has "
                                          r"no chat template"):
        load_tokenizer(str(plain), "data.tokenizer", True)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read by transformers"):
        load_tokenizer(str(tmp_path / "bad"), "data.tokenizer", False)


# ---- prompt files ----


def test_jsonl_and_parquet_give_the_same_batches(hf_dir: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(23)
    jl = _jsonl(tmp_path / "p.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    codec = load_tokenizer(str(hf_dir), "data.tokenizer", True)
    a = read_prompts(str(jl), "data.train", _opts(), codec)
    b = read_prompts(str(tmp_path / "p.parquet"), "data.train", _opts(), codec)
    assert a.rows == b.rows and a.size == 23 and a.dropped == 0
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)
    order = SampleOrder(a.size, seed=3)
    for step in range(6):  # batches of 8 over 23 rows: epochs wrap inside a step
        idx = order.step_indices(step, 8)
        assert [list(a.prompt_ids(int(i))) for i in idx] == \
               [list(b.prompt_ids(int(i))) for i in idx]
    assert a.summary()["prompt_len_max"] == a.longest > 0


def test_long_prompts_are_dropped_and_counted(hf_dir: Path, tmp_path: Path) -> None:
    codec = load_tokenizer(str(hf_dir), "data.tokenizer", False)
    rows = _rows(8)
    rows[3]["prompt"] = "How many clips " * 40
    rows[5]["prompt"] = "Weng earns " * 40
    ps = read_prompts(str(_jsonl(tmp_path / "p.jsonl", rows)), "data.train",
                      _opts(max_prompt_len=30), codec)
    assert ps.dropped == 2 and ps.size == 6 and ps.total_rows == 8
    assert list(ps.source) == [0, 1, 2, 4, 6, 7] and ps.longest <= 30
    assert [r["id"] for r in ps.rows] == [0, 1, 2, 4, 6, 7]


@pytest.mark.parametrize(("content", "fragment"), [
    (b"", "has no rows (an empty prompt file)"),
    (b"\n  \n", "has no rows"),
    (b'{"prompt": "a", "answer": "1"}\n{"answer": "2"}\n', "line 2 has no key 'prompt'"),
    (b'{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n', "line 2 has no key 'answer' "
                                                          "(data.answer_key)"),
    (b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff\xfe"}\n', "line 2 is not UTF-8 text"),
    (b'{"prompt": "a", "answer": 1\n', "line 1 is not valid JSON"),
    (b'["a", "b"]\n', "line 1 is a JSON list; each line must be a JSON object"),
    (b'{"prompt": "", "answer": "1"}\n', "'prompt' must be a non-empty string or a list"),
    (b'{"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}\n',
     "holds chat messages; they need data.chat_template: true"),
])
def test_bad_prompt_files(hf_dir: Path, tmp_path: Path, content: bytes, fragment: str) -> None:
    codec = load_tokenizer(str(hf_dir), "data.tokenizer", False)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"^data\.train=") as e:
        read_prompts(str(path), "data.train", _opts(), codec)
    assert fragment in str(e.value) and len(str(e.value).splitlines()) == 1


def test_bad_parquet_and_missing_files(hf_dir: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    codec = load_tokenizer(str(hf_dir), "data.tokenizer", False)
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "1"}]),
                   tmp_path / "q.parquet")
    with pytest.raises(ConfigError, match="has no column 'prompt' \\(columns: question, answer"):
        read_prompts(str(tmp_path / "q.parquet"), "data.train", _opts(), codec)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match="is not a readable parquet file"):
        read_prompts(str(tmp_path / "junk.parquet"), "data.train", _opts(), codec)
    with pytest.raises(ConfigError, match="no such file"):
        read_prompts(str(tmp_path / "none.jsonl"), "data.val", _opts(), codec)
    with pytest.raises(ConfigError, match="is a directory"):
        read_prompts(str(tmp_path), "data.train", _opts(), codec)


def test_every_row_once_per_epoch() -> None:
    order = SampleOrder(23, seed=7)
    taken = np.concatenate([order.step_indices(s, 8) for s in range(23)])  # 8 epochs
    for e in range(8):
        assert sorted(taken[e * 23:(e + 1) * 23].tolist()) == list(range(23))
    assert order.epoch_of(46) == 2 and order.epoch_of(45) == 1
    assert not np.array_equal(taken[:23], taken[23:46])  # a new permutation each epoch


def test_data_identity() -> None:
    opts = _opts().to_dict()
    base = data_identity("a" * 64, "", "t" * 64, opts)
    assert base == data_identity("a" * 64, "", "t" * 64, {**opts, "train": "elsewhere.jsonl"})
    for changed in (data_identity("b" * 64, "", "t" * 64, opts),
                    data_identity("a" * 64, "v", "t" * 64, opts),
                    data_identity("a" * 64, "", "u" * 64, opts),
                    data_identity("a" * 64, "", "t" * 64, {**opts, "seed": 1}),
                    data_identity("a" * 64, "", "t" * 64, {**opts, "prompt_key": "q"})):
        assert changed != base


# ---- config sections ----


def test_data_and_reward_sections() -> None:
    builtin = parse_data(None, prompt_len=8, seed=4)
    assert builtin.train.startswith("nereus:") and builtin.seed == 4
    assert builtin.max_prompt_len == 8
    assert parse_reward(None, data_given=False).fn.endswith(":pattern_reward")
    for raw, fragment in (
            ({"train": "a.csv", "tokenizer": "t"}, "data.train='a.csv': must be a jsonl or "
                                                   "parquet file"),
            ({"tokenizer": "t"}, "data.train=None: missing"),
            ({"train": "a.jsonl"}, "data.tokenizer=None: missing"),
            ({"train": "a.jsonl", "tokenizer": "t", "max_prompt_len": 9},
             "data.max_prompt_len=9: must be at most job.prompt_len=8"),
            ({"train": "a.jsonl", "tokenizer": "t", "prompt_key": ""}, "data.prompt_key=''"),
            ({"train": "a.jsonl", "tokenizer": "t", "shuffle": True}, "data.shuffle=True: "
                                                                      "unknown key")):
        with pytest.raises(ConfigError) as e:
            parse_data(raw, prompt_len=8, seed=0)
        assert fragment in str(e.value), str(e.value)
    assert parse_data({"train": "a.jsonl", "tokenizer": "t", "answer_key": None}, 8,
                      0).answer_key is None
    with pytest.raises(ConfigError, match=r"reward\.fn=None: missing"):
        parse_reward(None, data_given=True)
    for raw, fragment in (({"fn": "gsm9k"}, "must be gsm8k, math, exact or FILE.py:function"),
                          ({"fn": "r.py"}, "FILE.py:function"),
                          ({"fn": "r.txt:f"}, "FILE.py:function"),
                          ({"fn": "math", "on_error": "skip"}, "must be one of fail, zero"),
                          ({"fn": "math", "pass_threshold": "1"}, "must be a finite number")):
        with pytest.raises(ConfigError) as e:
            parse_reward(raw, data_given=True)
        assert fragment in str(e.value), str(e.value)
    assert parse_reward({"fn": "r.py:score", "on_error": "zero"}, True).on_error == "zero"


# ---- reward functions ----

USER = '''
def score(prompt, response, answer, row):
    return float(response.strip() == str(answer))

def fails(prompt, response, answer, row):
    raise ValueError(f"cannot score {row['id']}")

def word(prompt, response, answer, row):
    return "high"

def nan(prompt, response, answer, row):
    return float("nan")

def two(prompt, response):
    return 1.0

NOT_A_FUNCTION = 3
'''


def _item(i: int, response: str = "") -> ScoreItem:
    return ScoreItem("p", response, str(i), {"id": i}, f"data.train row {i}")


def test_user_functions_load_without_writing_bytecode(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text(USER)
    fn = load_reward(RewardOptions("r.py:score"), str(tmp_path))
    assert fn("p", " 7 ", "7", {}) == 1.0 and fn("p", "8", "7", {}) == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.py"]  # no __pycache__
    assert load_reward(RewardOptions("gsm8k"), str(tmp_path))("q", "#### 3", "3", {}) == 1.0
    for fn_name, fragment in (("missing.py:score", "no such file"),
                              ("r.py:absent", "r.py has no function 'absent'"),
                              ("r.py:NOT_A_FUNCTION", "is a int, not a function"),
                              ("r.py:two", "must take (prompt, response, answer, row)")):
        with pytest.raises(ConfigError, match=r"^reward\.fn=") as e:
            load_reward(RewardOptions(fn_name), str(tmp_path))
        assert fragment in str(e.value), str(e.value)
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(ConfigError, match="fails to import \\(ModuleNotFoundError"):
        load_reward(RewardOptions("broken.py:f"), str(tmp_path))


@pytest.mark.parametrize(("name", "fragment"), [
    ("fails", "raised ValueError('cannot score 2') on data.train row 2"),
    ("word", "returned 'high' (a str); it must return a number"),
    ("nan", "returned nan; it must return a finite number")])
def test_failures_end_the_run_or_score_zero(tmp_path: Path, name: str, fragment: str) -> None:
    (tmp_path / "r.py").write_text(USER)
    opts = RewardOptions(f"r.py:{name}")
    scorer = Scorer(load_reward(opts, str(tmp_path)), opts)
    with pytest.raises(RewardError) as e:
        scorer.score(4, lambda i: _item(i + 2))
    assert fragment in str(e.value) and "on_error: zero" in str(e.value)
    zero = Scorer(scorer.fn, RewardOptions(f"r.py:{name}", on_error="zero"))
    got = zero.score(4, lambda i: _item(i + 2))
    assert got.values == [0.0] * 4 and got.errors == 4 and fragment in got.first_error
    with pytest.raises(ConfigError, match="with an empty response"):
        probe(scorer, _item(2))
    if name == "fails":
        probe(zero, _item(2))  # forgiven
    else:
        with pytest.raises(ConfigError):
            probe(zero, _item(2))  # a wrong type is refused whatever on_error says


def test_shares_combine_in_order_and_the_first_failure_wins(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text(USER)
    opts = RewardOptions("r.py:score")
    scorer = Scorer(load_reward(opts, str(tmp_path)), opts)
    items = [_item(i, str(i) if i % 2 else "x") for i in range(7)]
    parts = [scorer.local(items.__getitem__, range(r, 7, 3)) for r in range(3)]  # 3 "ranks"
    assert scorer.combine(7, parts).values == [float(i % 2) for i in range(7)]
    bad = Scorer(lambda *a: 1 / 0 if a[3]["id"] in (5, 3) else 1.0, opts)
    parts = [bad.local(items.__getitem__, range(r, 7, 3)) for r in range(3)]
    with pytest.raises(RewardError, match="row 3"):  # the first failure by item, any rank
        bad.combine(7, list(reversed(parts)))


# ---- the shipped pattern task ----


def test_the_shipped_pattern_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    from nereus.rl.data.paths import PACKAGE_DATA
    from nereus.rl.task import write_files

    write_files(str(tmp_path))
    shipped = Path(PACKAGE_DATA) / "pattern"
    for name in ("train.jsonl", "val.jsonl", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_pattern_reward_scores_text_as_the_task_scored_tokens() -> None:
    from nereus.rl.data.paths import PACKAGE_DATA
    from nereus.rl.task import EOS, VOCAB_SIZE, PatternTask, encode

    codec = load_tokenizer(str(Path(PACKAGE_DATA) / "pattern"), "data.tokenizer", False)
    fn = load_reward(RewardOptions("nereus:pattern/reward.py:pattern_reward"), ".")
    task = PatternTask(seed=0)
    rng = np.random.default_rng(1)
    for index in range(300):
        prompt = task.prompt(index)
        assert codec.encode(prompt) == encode(prompt)
        resp = rng.integers(1, VOCAB_SIZE, size=int(rng.integers(0, 80))).tolist()  # no PAD
        text = codec.decode(codec.response_ids(resp))
        assert fn(prompt, text, task.pattern_of(prompt), {}) == task.reward(prompt, resp)
        assert EOS not in codec.encode(text)


def test_jsonl_and_parquet_runs_take_the_same_padded_batches(tmp_path: Path) -> None:
    """The step's batch tensors (``prompt_batch``: the global order, left-padded with the
    tokenizer's PAD to the longest prompt) of a run on a jsonl file and on the same rows as
    parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.rl.inputs import load_inputs
    from nereus.rl.task import PatternTask
    from nereus.runtime.worker.step import StepInputs, prompt_batch

    task = PatternTask(seed=3)
    rows = [{"prompt": task.prompt(i), "answer": task.pattern_of(task.prompt(i))}
            for i in range(30)]
    _jsonl(tmp_path / "p.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    batches = []
    for name in ("p.jsonl", "p.parquet"):
        cfg_path = tmp_path / f"{name}.yaml"
        cfg_path.write_text(
            "job: {algorithm: grpo, global_batch: 4, samples_per_prompt: 2, prompt_len: 8, "
            "gen_len: 8, reward_model: false}\n"
            "models: {actor: {preset: tiny-gpt, vocab_size: 8}}\n"
            "cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
            f"data: {{train: {name}, tokenizer: 'nereus:pattern', seed: 5}}\n"
            "reward: {fn: exact}\n")
        cfg = load_config(str(cfg_path))
        rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup)
        inputs, setup = load_inputs(cfg, str(cfg_path), rc, setup)
        assert setup.job.prompt_len == 5  # the longest prompt planned, not job.prompt_len
        inp = StepInputs(setup, rc, inputs)
        batches.append([prompt_batch(inp, step) for step in range(10)])  # 40 prompts: 2 epochs
    for (rows_a, a, valid_a), (rows_b, b, valid_b) in zip(*batches, strict=True):
        assert np.array_equal(rows_a, rows_b) and torch.equal(a, b)
        assert torch.equal(valid_a, valid_b) and torch.equal(valid_a, a != 0)  # PAD 0 masked
    taken = np.concatenate([r for r, _, _ in batches[0]])
    assert sorted(taken[:30].tolist()) == list(range(30))
    first = batches[0][0][1]
    assert first.shape == (4, 5) and bool((first[:, -1] == 2).all())  # left-padded: ":" last
    assert bool((first[:, 0] == 0).any())  # a 2-letter pattern's prompt padded with PAD 0


def _checkpoint_job(tmp_path: Path, ck: Path, data: str, models: str = "") -> Any:
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.rl.inputs import load_inputs

    cfg_path = tmp_path / "job.yaml"
    cfg_path.write_text(
        "job: {algorithm: grpo, global_batch: 4, samples_per_prompt: 2, prompt_len: 128, "
        "gen_len: 8, reward_model: false, dtype_bytes: 4}\n"
        f"models: {{actor: {{checkpoint: {ck}}}{models}}}\n"
        "cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n" + data)
    cfg = load_config(str(cfg_path))
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup)
    return load_inputs(cfg, str(cfg_path), rc, setup)[0]


def test_the_tokenizer_is_the_actor_checkpoints_when_the_data_names_none(tmp_path: Path) -> None:
    from support.hf_checkpoints import checkpoint
    from support.paths import REPO
    from transformers import AutoTokenizer

    ck = checkpoint("qwen2")  # what python -m nereus.tools.tiny_checkpoint DIR writes
    gsm8k = REPO / "tests" / "data" / "gsm8k" / "train.jsonl"
    inputs = _checkpoint_job(tmp_path, ck, f"data: {{train: {gsm8k}, prompt_key: question, "
                             "chat_template: true}\nreward: {fn: gsm8k}\n")
    codec = inputs.codec
    assert (codec.folder, codec.field) == (str(ck), "models.actor.checkpoint")
    ref = AutoTokenizer.from_pretrained(str(ck))
    question = json.loads(gsm8k.read_text().splitlines()[0])["question"]
    assert inputs.train.prompt_ids(0).tolist() == list(ref.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True,
        return_dict=False))
    # EOS from the checkpoint's generation config (<|im_end|>, then <|endoftext|>), PAD from
    # its tokenizer: the ids the engines stop at and pad with, and the export writes
    end, text_end = (ref.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert codec.special.eos_ids == (end, text_end) and codec.special.pad_id == text_end
    # without a data section: the pattern task's prompts through the checkpoint's tokenizer
    pattern = _checkpoint_job(tmp_path, ck, "")
    assert pattern.codec.folder == str(ck) and pattern.reward.fn.endswith(":pattern_reward")
    assert pattern.train.prompt_ids(0).tolist() == ref(pattern.train.rows[0]["prompt"])[
        "input_ids"]
    # data.tokenizer, when given, is the run's tokenizer
    own = _checkpoint_job(tmp_path, ck, f"data: {{train: {gsm8k}, prompt_key: question, "
                          "tokenizer: 'nereus:pattern'}\nreward: {fn: gsm8k}\n")
    assert own.codec.field == "data.tokenizer" and own.codec.vocab_size == 8
    # every model embeds the run's token ids: a smaller reference is refused, named
    with pytest.raises(ConfigError, match="cannot embed them") as e:
        _checkpoint_job(tmp_path, ck, "", ", reference: {preset: tiny-gpt, vocab_size: 64}")
    assert e.value.field == "models.reference.vocab_size"


def test_the_job_fingerprint_names_the_data(tmp_path: Path) -> None:
    """A resumed run continues only a checkpoint of the same data: the fingerprint's data part
    changes with the prompt file's bytes and an explicit data.seed, not with runtime.seed."""
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.rl.inputs import load_inputs
    from nereus.runtime.failures.resume_check import run_fingerprint

    def fingerprint(rows: list[dict[str, Any]], data: str = "", seed: int = 0) -> Any:
        _jsonl(tmp_path / "p.jsonl", rows)
        path = tmp_path / "job.yaml"
        path.write_text(
            "job: {algorithm: grpo, global_batch: 4, samples_per_prompt: 2, prompt_len: 8, "
            "gen_len: 8, reward_model: false}\n"
            "models: {actor: {preset: tiny-gpt, vocab_size: 8}}\n"
            "cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
            f"data: {{train: p.jsonl, tokenizer: 'nereus:pattern'{data}}}\n"
            f"reward: {{fn: exact}}\nruntime: {{seed: {seed}}}\n")
        cfg = load_config(str(path))
        rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup)
        return run_fingerprint(cfg, rc, load_inputs(cfg, str(path), rc, setup)[0].fingerprint())

    rows = [{"prompt": "ab:", "answer": "ab"}, {"prompt": "cde:", "answer": "cde"}]
    base = fingerprint(rows)
    assert dict(base.parts)["data"].startswith('{"identity":"') and base == fingerprint(rows)
    assert "data.identity" in fingerprint(rows[::-1]).differences(base)
    assert "data.identity" in fingerprint(rows, ", seed: 7").differences(base)
    assert fingerprint(rows, seed=3).differences(base) == "seed 0 (this config: 3)"


def test_a_generic_fast_tokenizer_folder_loads_as_autotokenizer_would(tmp_path: Path) -> None:
    """The pattern folder (tokenizer_config.json names the generic fast class, no config.json)
    is read without the auto classes, into the class AutoTokenizer gives, with the same ids and
    texts; beside a model's config.json, AutoTokenizer decides (5.x picks the model type's)."""
    import random
    import shutil

    from transformers import AutoTokenizer

    from nereus.rl.data.tokenizer import load_tokenizer

    pattern = Path(__file__).resolve().parents[2] / "nereus" / "data" / "pattern"
    with_model = tmp_path / "with-config"
    shutil.copytree(pattern, with_model)
    (with_model / "config.json").write_text('{"model_type": "llama"}')
    rng = random.Random(0)
    prompts = ["abc:", "eeda:", "c:"]
    for folder in (pattern, with_model):
        codec = load_tokenizer(str(folder), "data.tokenizer", False)
        ref = AutoTokenizer.from_pretrained(str(folder))
        assert type(codec.tokenizer) is type(ref), folder
        assert codec.encode_all(prompts) == ref(prompts)["input_ids"]
        for _ in range(200):
            ids = [rng.randrange(len(ref)) for _ in range(rng.randrange(1, 30))]
            assert codec.decode(ids) == ref.decode(ids, skip_special_tokens=True)
