"""``examples/grpo-gsm8k-tiny-cpu.yaml`` as the README runs it (mpi marker: real MPI ranks).

The checkpoint is written by ``python -m nereus.tools.tiny_checkpoint DIR`` (a Qwen2
architecture, random weights, a tokenizer trained locally); the example's own file runs with its
``runs/`` folders moved into the test's folder. On 4 CPU ranks: GRPO over the GSM8K-format jsonl
of tests/data with the checkpoint's tokenizer and chat template (the data section names no
tokenizer), a node leaving and coming back (transitions), greedy validation twice, TensorBoard
event files equal to the log's scalars and Hugging Face exports that transformers loads with
the tokenizer the run used.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.paths import REPO
from support.run_jobs import nereus

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
EXAMPLE = REPO / "examples" / "grpo-gsm8k-tiny-cpu.yaml"


def _tensorboard(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    out: dict[tuple[str, int], float] = {}
    for events in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for ev in acc.Tensors(tag):
                out[(tag, ev.step)] = float(tensor_util.make_ndarray(ev.tensor_proto))
    return out


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_gsm8k_example_on_a_tiny_qwen2_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "tiny-qwen2"
    made = subprocess.run([sys.executable, "-m", "nereus.tools.tiny_checkpoint", str(ck)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert made.returncode == 0, made.stderr
    text = EXAMPLE.read_text()
    assert "runs/tiny-qwen2" in text and "../tests/data/gsm8k/" in text
    text = text.replace("runs/", f"{tmp_path}/").replace("../tests/data/",
                                                         f"{REPO}/tests/data/")
    cfg = tmp_path / "grpo-gsm8k-tiny-cpu.yaml"
    cfg.write_text(text)
    log = tmp_path / "run.h5"
    res = nereus("run", str(cfg), "--log", str(log), timeout_s=1400)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    from nereus.log.reader import read_run_log
    from nereus.log.scalars import plan_scalars, scalars
    from nereus.log.sinks import log_rows
    from nereus.rl.rewards.builtin import gsm8k

    run = read_run_log(log)
    assert list(run.steps["step"]) == [0, 1, 2, 3]
    # the tokenizer is the actor checkpoint's (the data section names none), EOS from its
    # generation config: <|im_end|> and <|endoftext|>; PAD <|endoftext|>
    data = next(d for k, d in zip(run.events["kind"], run.events["detail"], strict=True)
                if k == "data")
    tok = json.loads((ck / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert Path(data["tokenizer"]) == ck and data["chat_template"] is True
    assert data["eos_ids"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert data["pad_id"] == ids["<|endoftext|>"]
    # node 1 left after step 1: the plan changed (the job on 2 ranks, DP 2)
    plans = list(run.tables["transitions"]["plan"])
    assert plans and {sp["dp"] for sp in plans[0]["stages"]} == {2}
    # the logged rewards are the GSM8K scorer's of the logged responses
    train = [json.loads(line) for line in
             (REPO / "tests/data/gsm8k/train.jsonl").read_text().splitlines()]
    s = run.tables["samples"]
    assert len(s["step"]) == 4 * 4
    for row, reward, response in zip(s["row"], s["reward"], s["response"], strict=True):
        r = train[int(row)]
        assert gsm8k(r["question"], response, r["answer"], r) == reward
    # validation after steps 2 and 4, over the 8 prompts of val.jsonl
    v = run.tables["validation"]
    assert list(v["step"]) == [1, 3] and set(v["prompts"]) == {8}
    assert np.all(np.isfinite(v["len_mean"])) and np.all(v["len_mean"] > 0)
    # TensorBoard: every scalar of the log
    tb = _tensorboard(tmp_path / "grpo-gsm8k-tb")
    want = {(tag, st): val for tag, st, val in plan_scalars(run.initial_plan, 0)}
    for table, row in log_rows(run):
        want.update({(tag, st): val for tag, st, val in scalars(table, row)})
    assert want and tb == want and ("val/pass@1", 3) in tb
    # the exports after steps 2 and 4: transformers loads the actor with the run's tokenizer
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "grpo-gsm8k-hf"
    assert sorted(p.name for p in out.iterdir()) == ["step-000002", "step-000004"]
    actor = out / "step-000004" / "actor"
    model, info = AutoModelForCausalLM.from_pretrained(str(actor), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert type(model).__name__ == "Qwen2ForCausalLM"
    tokenizer = AutoTokenizer.from_pretrained(str(actor))
    assert (actor / "tokenizer.json").read_bytes() == (ck / "tokenizer.json").read_bytes()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": train[0]["question"]}],
                                           add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        logits = model(**prompt).logits
    assert torch.isfinite(logits).all()
