"""One RL step on this rank (PPO, GRPO, ReMax): gen → inf → train → weight sync (sync mode),
or, in async mode, the next batch's generation beside this batch's inf → train (one step
off-policy, :func:`run_async_step`).

Every rank runs this for every step with the same arguments. A model-stage runs on the ranks of
its units; each DP replica takes its contiguous slice of the step's sequences (global order,
``replica_slice``), all tp ranks of a replica compute on the same inputs. After each phase the
first rank of every replica contributes its slice to an MPI all-gather (framed plain data and
array bytes, :mod:`nereus.runtime.mpi.frames`), so every rank holds the whole batch (tiny on CPU); batch-level math (rewards, GAE) is then identical on every rank and
independent of the plan. Units of any tp×pp: forward passes go through
:mod:`nereus.runtime.worker.train` (the CPU pipeline schedule); the last pp stage reports.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from nereus.config.run import RunConfig
from nereus.engines.backend import GenRequest
from nereus.engines.forward import response_logp, response_values, sequence_scores
from nereus.engines.masks import full_valid
from nereus.rl.grpo import kl_loss_sum, sequence_advantages
from nereus.rl.ppo import PpoBatch, policy_loss_sum, ppo_batch, value_loss_sum
from nereus.rl.sample_order import SampleOrder, replica_slice
from nereus.rl.task import PatternTask
from nereus.rl.tokens import TaskCodec, TextCodec, response_ids
from nereus.runtime.mpi.frames import allgather
from nereus.runtime.worker.gen_engines import actor_gen_engine
from nereus.runtime.worker.memory import MemoryAccount, resident_bytes
from nereus.runtime.worker.train import is_reporter, unit_forward_backward, unit_logits
from nereus.runtime.worker.units import PlanUnits, allreduce_grads, zero_grads
from nereus.spec.job import Setup


@dataclass(frozen=True)
class StepInputs:
    setup: Setup
    rc: RunConfig
    task: PatternTask
    order: SampleOrder
    # prompts → ids, EOS and PAD (the task's own, or a checkpoint's tokenizer: rl/tokens.py)
    codec: TextCodec = field(default_factory=TaskCodec)


def prompt_batch(inp: StepInputs, step: int) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The step's prompts (global order) left-padded to ``job.prompt_len`` tokens with the
    codec's PAD, and [b, P] True on their real tokens (the padding is masked out of attention)."""
    job = inp.setup.job
    ids = inp.order.indices(step * job.global_batch, job.global_batch)
    texts = [inp.task.prompt(int(i)) for i in ids]
    pad = inp.codec.special.pad_id
    rows, valid = [], []
    for t in texts:
        toks = inp.codec.encode(t)[-job.prompt_len:]
        rows.append([pad] * (job.prompt_len - len(toks)) + toks)
        valid.append([False] * (job.prompt_len - len(toks)) + [True] * len(toks))
    return texts, torch.tensor(rows, dtype=torch.long), torch.tensor(valid, dtype=torch.bool)


def reward_of(inp: StepInputs, prompt: str, response: list[int]) -> float:
    """The task's reward of one response: on token ids with the task's own vocabulary, else on
    the text the codec decodes up to the first EOS."""
    if inp.codec.ids_reward:
        return inp.task.reward(prompt, response)
    return inp.task.reward_text(prompt, inp.codec.decode(response_ids(response,
                                                                      inp.codec.special)))


def _exchange(comm: Any, contribution: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's contribution (plain data and numpy arrays), framed and agreed."""
    return allgather(comm, contribution, "exchange")


def _resident(units: PlanUnits) -> int:
    return resident_bytes((st.model, st.optimizer) for st in units.units())


def _reports(st: Any) -> bool:
    """Whether this rank contributes its replica's results (last pp stage, tp rank 0)."""
    return is_reporter(st)


def _my_replicas(units: Any, names: tuple[str, ...]) -> Iterator[tuple[str, Any, int, Any]]:
    """(name, stage units, dp rank, unit state) of each model-stage in ``names`` that this rank
    holds a replica of, in order."""
    for name in names:
        su = units.stages.get(name)
        mine = None if su is None else su.my_replica()
        if mine is not None:
            yield name, su, mine[0], mine[1]


@dataclass(frozen=True)
class Rollout:
    """One step's generated batch, the same on every rank (plain CPU tensors, plan-free):
    ``tokens``/``greedy_tokens`` [n, P+T], ``logp``/``mask`` [n, T]; ``texts`` the prompts."""

    step: int
    texts: list[str]
    tokens: torch.Tensor
    greedy_tokens: torch.Tensor
    logp: torch.Tensor
    mask: torch.Tensor
    halted: bool = False  # a rank ran out of device memory generating it: incomplete
    prompt_valid: torch.Tensor | None = None  # [n, P] True on real prompt tokens


def generate_rollout(inp: StepInputs, units: PlanUnits, step: int, comm: Any,
                     account: MemoryAccount, stage_s: dict[str, float]) -> Rollout:
    """Generate step ``step``'s batch with actor-gen's current weights (collective)."""
    job, rc = inp.setup.job, inp.rc
    n_seq = job.global_batch * job.samples_per_prompt
    p_len, t_new = job.prompt_len, rc.max_new_tokens
    texts, prompts, valid = prompt_batch(inp, step)
    prompts = prompts.repeat_interleave(job.samples_per_prompt, dim=0)
    valid = valid.repeat_interleave(job.samples_per_prompt, dim=0)
    special = inp.codec.special
    seq_ids = np.arange(n_seq)
    contrib: dict[str, Any] = {}
    su = units.stages["actor-gen"]
    engine = actor_gen_engine(rc, inp.setup, su)  # runtime.generation; checked on every rank
    mine = su.my_replica()
    if mine is not None and engine is not None:
        with account.guard("actor-gen"):  # out of memory: the step halts and is redone
            dp_rank, st = mine
            lo, hi = replica_slice(n_seq, su.plan.dp, dp_rank)
            t0 = time.perf_counter()
            engine.refresh_weights()  # the weights the last sync wrote (in place for megatron)
            req = GenRequest(prompts[lo:hi], seq_ids[lo:hi], rc.seed, step, t_new,
                             rc.temperature, prompt_valid=valid[lo:hi],
                             eos_ids=special.eos_ids, pad_id=special.pad_id)
            g = engine.generate(req)
            kv_bytes = g.kv_cache_bytes
            greedy = None
            if job.algorithm == "remax":  # the greedy baseline response of every prompt
                gg = engine.generate(replace(req, greedy=True))
                greedy = (gg.tokens.numpy(), gg.mask.numpy())
                kv_bytes = max(kv_bytes, gg.kv_cache_bytes)
            stage_s["actor-gen"] = stage_s.get("actor-gen", 0.0) + time.perf_counter() - t0
            account.observe("actor-gen", _resident(units), kv_bytes)
            if _reports(st):
                contrib["gen"] = (lo, g.tokens.numpy(), g.logp.numpy(), g.mask.numpy(), greedy)
    if account.halted:
        contrib = {"halt": True}
    exchanged = _exchange(comm, contrib)
    halted = any(c.get("halt") for c in exchanged)
    parts = [c["gen"] for c in exchanged if "gen" in c]
    tokens = torch.zeros(n_seq, p_len + t_new, dtype=torch.long)
    greedy_tokens = torch.zeros(n_seq, p_len + t_new, dtype=torch.long)
    greedy_mask = torch.zeros(n_seq, t_new, dtype=torch.float64)
    logp = torch.zeros(n_seq, t_new, dtype=torch.float64)
    mask = torch.zeros(n_seq, t_new, dtype=torch.float64)
    for lo, tk, lp, mk, gr in parts:
        hi = lo + tk.shape[0]
        tokens[lo:hi], logp[lo:hi], mask[lo:hi] = (torch.from_numpy(a) for a in (tk, lp, mk))
        if gr is not None:
            greedy_tokens[lo:hi], greedy_mask[lo:hi] = (torch.from_numpy(a) for a in gr)
    # The batch ends where its longest response ends (sampled or greedy): inference and training
    # run on that many tokens, not on max_new_tokens of padding (PAD and zero masks beyond).
    used = (mask.sum(dim=0) > 0) | (greedy_mask.sum(dim=0) > 0)
    width = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
    return Rollout(step, texts, tokens[:, :p_len + width].contiguous(),
                   greedy_tokens[:, :p_len + width].contiguous(),
                   logp[:, :width].contiguous(), mask[:, :width].contiguous(), halted,
                   valid.contiguous())


def run_step(inp: StepInputs, units: PlanUnits, step: int, comm: Any,
             account: MemoryAccount) -> dict[str, Any]:
    """Synchronous step ``step``: gen → inf → train → weight sync; this rank's measurements."""
    stage_s: dict[str, float] = {}
    account.begin_step(step)
    rollout = generate_rollout(inp, units, step, comm, account, stage_s)
    return learn_step(inp, units, rollout, comm, account, stage_s)


def run_async_step(inp: StepInputs, units: PlanUnits, step: int, comm: Any,
                   account: MemoryAccount, pending: Rollout | None
                   ) -> tuple[dict[str, Any], Rollout | None]:
    """Asynchronous step ``step`` (one step off-policy): the generation of batch ``step + 1``
    overlaps the inference and training of batch ``step`` (generated one step earlier), then the
    weight sync — the step boundary, where transitions happen — gives actor-gen the new weights.
    So batch k is sampled with the policy after k − 1 updates (batches 0 and 1 with the initial
    one) and PPO's ratio is taken against that behaviour policy. On CPU the two lanes run one
    after the other on the ranks (each rank does its part; the semantics are the async ones).
    ``pending`` is batch ``step`` (None at the first step: it is generated here); returns the
    measurements and batch ``step + 1`` (None after the last step)."""
    stage_s: dict[str, float] = {}
    account.begin_step(step)
    if pending is None:
        pending = generate_rollout(inp, units, step, comm, account, stage_s)
        if pending.halted:  # out of device memory: the step is redone, its batch anew
            return _halted(account, stage_s), None
    if pending.step != step:
        raise ValueError(f"async step {step} got the batch of step {pending.step}")
    ahead = None
    if step + 1 < inp.rc.steps:
        ahead = generate_rollout(inp, units, step + 1, comm, account, stage_s)
        if ahead.halted:  # redo the step with the same batch (no update ran)
            return _halted(account, stage_s), pending
    res = learn_step(inp, units, pending, comm, account, stage_s)
    return res, (pending if res.get("redo") else ahead)


def learn_step(inp: StepInputs, units: PlanUnits, rollout: Rollout, comm: Any,
               account: MemoryAccount, stage_s: dict[str, float]) -> dict[str, Any]:
    """Inference, rewards, advantages, training on ``rollout``, then the weight sync."""
    job, rc = inp.setup.job, inp.rc
    n_seq = job.global_batch * job.samples_per_prompt
    p_len, t_new = job.prompt_len, rollout.mask.shape[1]  # the batch's longest response
    texts, tokens, greedy_tokens = rollout.texts, rollout.tokens, rollout.greedy_tokens
    logp, mask = rollout.logp, rollout.mask
    valid = full_valid(rollout.prompt_valid, t_new)  # [n, P+T]: the prompts' padding masked

    def rows(a: int, b: int) -> torch.Tensor | None:
        return None if valid is None else valid[a:b]

    # -- inference ---------------------------------------------------------------------------
    if rollout.halted:  # a rank ran out of memory generating the batch: redo the step
        return _halted(account, stage_s)
    contrib: dict[str, Any] = {}
    for name, su, dp_rank, st in _my_replicas(units, ("ref-inf", "reward-inf", "critic-inf")):
        if account.halted:
            break
        with account.guard(name):
            lo, hi = replica_slice(n_seq, su.plan.dp, dp_rank)
            t0 = time.perf_counter()
            lg = unit_logits(st, tokens[lo:hi], rows(lo, hi))  # on the last pp stage only
            out: torch.Tensor | None
            if lg is None:
                out = None
            elif name == "ref-inf":
                out = response_logp(lg, tokens[lo:hi], p_len)
            elif name == "critic-inf":
                out = response_values(lg, p_len)
            else:
                out = sequence_scores(lg, mask[lo:hi], p_len)
            stage_s[name] = time.perf_counter() - t0
            account.observe(name, _resident(units))
            if out is not None and _reports(st):
                contrib[name] = (lo, out.numpy())
    if account.halted:
        contrib = {"halt": True}
    got: dict[str, list[tuple[int, np.ndarray]]] = {}
    exchanged = _exchange(comm, contrib)
    if any(c.get("halt") for c in exchanged):  # no update ran yet: the step can be redone
        return _halted(account, stage_s)
    for c in exchanged:
        for k, v in c.items():
            got.setdefault(k, []).append(v)

    def full(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        out = torch.zeros(shape, dtype=torch.float64)
        for lo, arr in got.get(name, []):
            out[lo:lo + arr.shape[0]] = torch.from_numpy(arr)
        return out

    ref_logp = full("ref-inf", (n_seq, t_new))
    values = full("critic-inf", (n_seq, t_new))
    rm_scores = full("reward-inf", (n_seq,))
    prompt_of = [texts[i // job.samples_per_prompt] for i in range(n_seq)]
    resp = tokens[:, p_len:]
    scores = torch.tensor([reward_of(inp, prompt_of[i], resp[i].tolist()) for i in range(n_seq)],
                          dtype=torch.float64)
    if rc.reward == "model":
        scores = rm_scores
    critic_free = job.algorithm != "ppo"
    if critic_free:
        greedy_scores = None
        if job.algorithm == "remax":
            g_resp = greedy_tokens[:, p_len:]
            greedy_scores = torch.tensor([reward_of(inp, prompt_of[i], g_resp[i].tolist())
                                          for i in range(n_seq)], dtype=torch.float64)
            if rc.reward == "model":
                greedy_scores = _greedy_model_scores(inp, units, comm, greedy_tokens, mask,
                                                     p_len, valid)
        adv = sequence_advantages(job.algorithm, scores, job.samples_per_prompt, greedy_scores)
        n_all = float(mask.sum().clamp_min(1.0))
        batch = PpoBatch(adv.unsqueeze(1) * mask, torch.zeros_like(mask),
                         float(((logp - ref_logp) * mask).sum()) / n_all)
    else:
        batch = ppo_batch(scores, logp, ref_logp, values, mask, rc.kl_coef, rc.gae_lambda)

    # -- training ----------------------------------------------------------------------------
    contrib = {}
    per_mb = n_seq // job.minibatches
    for name, su, dp_rank, st in _my_replicas(units, ("actor-train", "critic-train")):
        t0 = time.perf_counter()
        loss_total = 0.0
        for m in range(job.minibatches):
            base = m * per_mb
            lo, hi = replica_slice(per_mb, su.plan.dp, dp_rank)
            lo, hi = base + lo, base + hi
            n_tok = float(mask[base:base + per_mb].sum().clamp_min(1.0))
            zero = name in units.zero_names  # a DeepSpeed ZeRO unit: it reduces and steps
            if not zero:
                zero_grads(st)
            mb = max(1, su.plan.micro_batch)
            spans = [(a, min(hi, a + mb)) for a in range(lo, hi, mb)]

            def loss_of(i: int, lg: torch.Tensor, name: str = name, spans: Any = spans,
                        n_tok: float = n_tok) -> torch.Tensor:
                a, b = spans[i]

                def at(t: torch.Tensor) -> torch.Tensor:  # the batch's rows where the logits are
                    return t[a:b].to(lg.device)

                if name == "actor-train":
                    new_logp = response_logp(lg, at(tokens), p_len)
                    loss = policy_loss_sum(new_logp, at(logp), at(batch.advantages), at(mask),
                                           rc.clip)
                    if critic_free:
                        loss = loss + rc.kl_coef * kl_loss_sum(new_logp, at(ref_logp), at(mask))
                    loss = loss / n_tok
                else:
                    loss = value_loss_sum(response_values(lg, p_len), at(values),
                                          at(batch.returns), at(mask), rc.clip) / n_tok
                return loss

            # 1F1B through the unit's pipeline stages (pp=1: forward, backward per microbatch);
            # out of memory here ends the job (DeviceOutOfMemory): updates may have run
            with account.guard(name, redo=False):
                mbs = [tokens[a:b] for a, b in spans]
                vs = [rows(a, b) for a, b in spans]
                loss_total += (st.forward_backward(mbs, loss_of, vs) if zero
                               else unit_forward_backward(st, mbs, loss_of, vs))
            account.observe(name, _resident(units))
            if zero:
                st.step()  # DeepSpeed reduces the gradients over the unit's DP group, steps
            else:
                allreduce_grads(st, su.dp_group)
                st.optimizer.step()
            st.counters.updates += 1
            st.counters.position += 1
            st.counters.policy_version += 1
        stage_s[name] = time.perf_counter() - t0
        if _reports(st):
            contrib[name] = loss_total / job.minibatches
    losses: dict[str, float] = {}
    for c in _exchange(comm, contrib):
        for k, v in c.items():
            losses[k] = losses.get(k, 0.0) + v

    t0 = time.perf_counter()
    sync_bytes = units.sync_weights()
    stage_s["weight-sync"] = time.perf_counter() - t0
    lengths = mask.sum(dim=1).numpy()
    peak, ooms = account.take()
    return {
        "stage_s": stage_s,
        "peak_bytes": peak,
        "oom": [e.to_dict() for e in ooms],
        "reward": float(scores.mean()),
        "rm_score": float(rm_scores.mean()),
        "len_mean": float(lengths.mean()),
        "len_p95": float(np.percentile(lengths, 95)),
        "tokens": int(lengths.sum()),
        "kl": batch.kl,
        "losses": losses,
        "sync_bytes": sync_bytes,
    }


def _halted(account: MemoryAccount, stage_s: dict[str, float]) -> dict[str, Any]:
    """The measurements of a step that stopped: a rank ran out of device memory before any
    update, so no state changed; ``redo`` asks for the step again after the urgent replan."""
    peak, ooms = account.take()
    nan = float("nan")
    return {"stage_s": stage_s, "peak_bytes": peak, "oom": [e.to_dict() for e in ooms],
            "reward": nan, "rm_score": nan, "len_mean": nan, "len_p95": nan, "tokens": 0,
            "kl": nan, "losses": {}, "sync_bytes": 0, "redo": True}


def _greedy_model_scores(inp: StepInputs, units: PlanUnits, comm: Any,
                         greedy_tokens: torch.Tensor, mask: torch.Tensor, p_len: int,
                         valid: torch.Tensor | None) -> torch.Tensor:
    """Reward-model scores of the greedy responses (ReMax with ``runtime.reward: model``)."""
    resp = greedy_tokens[:, p_len:]
    g_mask = torch.ones_like(mask)
    stops = torch.tensor(inp.codec.special.eos_ids, dtype=torch.long)
    for i in range(resp.shape[0]):  # up to and including the first EOS
        hits = torch.isin(resp[i], stops).nonzero()
        if len(hits):
            g_mask[i, int(hits[0]) + 1:] = 0.0
    su = units.stages["reward-inf"]
    contrib: dict[str, Any] = {}
    mine = su.my_replica()
    n = greedy_tokens.shape[0]
    if mine is not None:
        dp_rank, st = mine
        lo, hi = replica_slice(n, su.plan.dp, dp_rank)
        lg = unit_logits(st, greedy_tokens[lo:hi], None if valid is None else valid[lo:hi])
        if lg is not None and _reports(st):
            contrib["g"] = (lo, sequence_scores(lg, g_mask[lo:hi], p_len).numpy())
    out = torch.zeros(n, dtype=torch.float64)
    for c in _exchange(comm, contrib):
        if "g" in c:
            lo, arr = c["g"]
            out[lo:lo + arr.shape[0]] = torch.from_numpy(arr)
    return out
