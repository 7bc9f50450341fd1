"""Validation (``runtime.val_every``): after a step's weight sync, actor-gen generates a response
to every prompt of ``data.val`` greedily (and ``runtime.val_samples`` sampled ones per prompt if
asked); ``reward.fn`` scores them like training responses, shared out over the ranks. Mean
reward, pass@1 (the share of responses whose reward reaches ``reward.pass_threshold``), mean
length and, with samples, pass@k go to rank 0 (the run log's ``/validation``, the console line,
TensorBoard).

The prompts run in batches of the training batch's size (``global_batch × samples_per_prompt``
sequences, the last one filled up with its last prompt, whose extra responses are dropped), each
actor-gen replica generating its contiguous slice, so validation holds no more memory than a
step's generation does. Sampled validation responses draw their uniforms from sample ids of their
own (``VAL_SAMPLE_BASE`` onward), never from a training sequence's. Greedy responses are the
argmax of the same logits under any plan: they agree across plans up to reduction order (a
response can differ only where two top logits are within the rounding of a TP all-reduce).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import torch

from nereus.engines.backend import GenRequest
from nereus.rl.sample_order import replica_slice
from nereus.runtime.mpi.frames import allgather
from nereus.runtime.worker.gen_engines import actor_gen_engine
from nereus.runtime.worker.rewards import response_text
from nereus.runtime.worker.train import is_reporter

VAL_SAMPLE_BASE = 1 << 40  # sample ids of validation responses (training uses 0 .. n-1 per step)


def _generate(inp: Any, units: Any, rows: list[int], greedy: bool, step: int, comm: Any,
              base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(response ids [n, T], mask [n, T]) of one response per entry of ``rows`` (kept rows of
    data.val), batch by batch (collective)."""
    job, rc, data = inp.setup.job, inp.rc, inp.data
    width = job.global_batch * job.samples_per_prompt
    t_new = rc.max_new_tokens
    n = len(rows)
    out_tok = torch.full((n, t_new), data.codec.pad_id, dtype=torch.long)
    out_mask = torch.zeros(n, t_new, dtype=torch.float64)
    su = units.stages["actor-gen"]
    for start in range(0, n, width):
        chunk = rows[start:start + width]
        chunk = chunk + [chunk[-1]] * (width - len(chunk))
        prompts = torch.full((width, job.prompt_len), data.codec.pad_id, dtype=torch.long)
        valid = torch.zeros((width, job.prompt_len), dtype=torch.bool)
        for k, r in enumerate(chunk):
            ids = data.val.prompt_ids(r)
            prompts[k, job.prompt_len - len(ids):] = torch.from_numpy(ids)
            valid[k, job.prompt_len - len(ids):] = True
        engine = actor_gen_engine(rc, inp.setup, su)
        mine = su.my_replica()
        contrib: dict[str, Any] = {}
        if mine is not None and engine is not None:
            dp_rank, st = mine
            lo, hi = replica_slice(width, su.plan.dp, dp_rank)
            engine.refresh_weights()
            special = data.codec.special
            g = engine.generate(GenRequest(prompts[lo:hi], base + start + np.arange(lo, hi),
                                           rc.seed, step, t_new, rc.temperature, greedy=greedy,
                                           prompt_valid=valid[lo:hi], eos_ids=special.eos_ids,
                                           pad_id=special.pad_id))
            if is_reporter(st):
                contrib["gen"] = (lo, g.tokens[:, job.prompt_len:].numpy(), g.mask.numpy())
        for c in allgather(comm, contrib, "validation"):
            if "gen" not in c:
                continue
            lo, tk, mk = c["gen"]
            for k in range(tk.shape[0]):
                i = start + lo + k
                if i < n:
                    out_tok[i, :tk.shape[1]] = torch.from_numpy(tk[k])
                    out_mask[i, :mk.shape[1]] = torch.from_numpy(mk[k])
    return out_tok, out_mask


def _score(inp: Any, rows: list[int], tokens: torch.Tensor, mask: torch.Tensor, step: int,
           comm: Any, what: str) -> Any:
    data = inp.data

    def item_of(i: int) -> Any:
        return data.item(data.val, rows[i], response_text(data, tokens[i], mask[i]),
                         f"validation after step {step + 1}, {what} response {i}")

    return data.scorer.score(len(rows), item_of, comm, "val-rewards")


def validate(inp: Any, units: Any, step: int, comm: Any) -> dict[str, Any]:
    """Validation after step ``step`` (collective); its row of the run log."""
    t0 = time.perf_counter()
    data = inp.data
    assert data.val is not None  # load_inputs requires data.val with val_every
    threshold = data.reward.pass_threshold
    rows = list(range(data.val.size))
    tok, mask = _generate(inp, units, rows, True, step, comm, VAL_SAMPLE_BASE)
    greedy = _score(inp, rows, tok, mask, step, comm, "greedy")
    rewards = np.array(greedy.values)
    lengths = mask.sum(dim=1).numpy()
    digest = hashlib.sha256()
    for i in range(len(rows)):
        digest.update(np.asarray(tok[i][mask[i] > 0], dtype=np.int64).tobytes() + b"|")
    k = inp.rc.outputs.val_samples
    nan = float("nan")
    sampled, sampled_pass, pass_k, errors = nan, nan, nan, greedy.errors
    if k:
        srows = [r for r in rows for _ in range(k)]
        stok, smask = _generate(inp, units, srows, False, step, comm,
                                VAL_SAMPLE_BASE + len(rows))
        s = _score(inp, srows, stok, smask, step, comm, "sampled")
        values = np.array(s.values).reshape(len(rows), k)
        sampled = float(values.mean())
        sampled_pass = float((values >= threshold).mean())
        pass_k = float((values >= threshold).any(axis=1).mean())
        errors += s.errors
    return {"prompts": len(rows), "reward": float(rewards.mean()),
            "pass_at_1": float((rewards >= threshold).mean()),
            "len_mean": float(lengths.mean()), "samples": k, "sampled_reward": sampled,
            "sampled_pass_at_1": sampled_pass, "pass_at_k": pass_k, "errors": errors,
            "seconds": time.perf_counter() - t0,
            "detail": {"rewards": rewards.tolist(), "lengths": lengths.tolist(),
                       "responses_sha256": digest.hexdigest()}}
