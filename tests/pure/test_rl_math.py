"""RL math: advantages, losses, the embedded task and the global sample order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.loss_oracle import kl_to_reference, policy_loss, value_loss

from nereus.rl.advantages import gae, grpo_advantages, remax_advantages
from nereus.rl.grpo import kl_loss_sum
from nereus.rl.ppo import policy_loss_sum, value_loss_sum
from nereus.rl.sample_order import SampleOrder, replica_slice
from nereus.rl.task import EOS, SEP, VOCAB_SIZE, PatternTask, decode, encode


def reference_gae(r: list[float], v: list[float], gamma: float, lam: float) -> list[float]:
    n = len(r)
    adv = [0.0] * n
    nxt = 0.0
    for t in reversed(range(n)):
        v_next = v[t + 1] if t + 1 < n else 0.0
        delta = r[t] + gamma * v_next - v[t]
        nxt = delta + gamma * lam * nxt
        adv[t] = nxt
    return adv


@given(
    st.lists(st.floats(-2, 2), min_size=1, max_size=8),
    st.integers(0, 3),
    st.floats(0.5, 1.0),
    st.floats(0.0, 1.0),
)
@settings(max_examples=50, deadline=None)
def test_gae_matches_the_textbook_recursion(r: list[float], pad: int, gamma: float, lam: float) -> None:
    n = len(r)
    v = [0.1 * (i + 1) for i in range(n)]
    rewards = torch.tensor([[*r, *([0.0] * pad)]], dtype=torch.float64)
    values = torch.tensor([[*v, *([5.0] * pad)]], dtype=torch.float64)
    mask = torch.tensor([[1] * n + [0] * pad])
    adv, ret = gae(rewards, values, mask, gamma, lam)
    want = reference_gae(r, v, gamma, lam)
    assert torch.allclose(adv[0, :n], torch.tensor(want, dtype=torch.float64))
    assert torch.all(adv[0, n:] == 0) and torch.all(ret[0, n:] == 0)


def test_grpo_and_remax_advantages() -> None:
    s = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0])
    a = grpo_advantages(s, group_size=2)
    assert a[0] > 0 > a[1] and abs(float(a[2])) < 1e-6 and abs(float(a[5])) < 1e-6
    assert torch.allclose(remax_advantages(s, torch.ones(6)), s - 1)
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(5), 2)


def test_losses() -> None:
    """The oracle's textbook values, then the runtime's token sums equal to the oracle's means
    times the token count (masked tokens excluded, clipping on both sides)."""
    mask = torch.tensor([[1, 1, 0]])
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    adv = torch.tensor([[1.0, -1.0, 100.0]])
    assert float(policy_loss(lp, lp, adv, mask)) == pytest.approx(0.0)  # ratio 1: −mean(A)
    big = policy_loss(lp + 1.0, lp, adv, mask)  # ratio e: clipped at 1.2 for A > 0
    assert float(big) == pytest.approx(-(1.2 * 1.0 + np.e * -1.0) / 2)
    v = torch.tensor([[0.0, 1.0, 9.0]])
    assert float(value_loss(v, v, v, mask)) == 0.0
    assert float(kl_to_reference(lp, lp, mask)) == 0.0
    assert float(kl_to_reference(lp, lp - 0.5, mask)) > 0.0
    g = torch.Generator().manual_seed(1)
    logp, old, ref, a, values, old_v, ret = (torch.randn(4, 6, generator=g, dtype=torch.float64)
                                             for _ in range(7))
    m = (torch.rand(4, 6, generator=g) > 0.3).double()
    n = float(m.sum())
    assert float(policy_loss_sum(logp, old, a, m, 0.2)) == pytest.approx(
        n * float(policy_loss(logp, old, a, m, 0.2)), rel=1e-12)
    assert float(value_loss_sum(values, old_v, ret, m, 0.2)) == pytest.approx(
        n * float(value_loss(values, old_v, ret, m, 0.2)), rel=1e-12)
    assert float(kl_loss_sum(logp, ref, m)) == pytest.approx(
        n * float(kl_to_reference(logp, ref, m)), rel=1e-12)


def test_pattern_task_rewards_longer_correct_responses() -> None:
    task = PatternTask(credit_len=20)
    prompt = task.prompt(3)
    assert prompt == task.prompt(3) and prompt.endswith(":")
    pat = task.pattern_of(prompt)
    good = encode((pat * 10)[:6]) + [EOS]
    longer = encode((pat * 10)[:9]) + [EOS]
    assert task.reward(prompt, good) == 6.0 and task.reward(prompt, longer) == 9.0
    wrong_first = [SEP] + encode((pat * 10)[1:6]) + [EOS]  # a mistake, then 5 matches
    assert task.reward(prompt, wrong_first) == 2.5
    assert task.reward(prompt, [EOS] + encode(pat * 5)) == 0.0  # nothing before EOS counts
    assert task.reward(prompt, encode(pat * 50)) == 20.0  # credit stops at credit_len tokens
    assert decode(encode(prompt + "\n")) == prompt + "\n"
    with pytest.raises(ValueError, match="vocabulary"):
        encode("z")


@given(st.integers(0, 10_000), st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=80))
@settings(max_examples=80, deadline=None)
def test_pattern_reward_is_rule_based_partial_credit(index: int, response: list[int]) -> None:
    """The reward is a function of (prompt, response) alone: 0.5 per matching position before
    EOS plus 0.5 per token of the correct run from the start; extending a response with the
    correct next token never lowers it."""
    task = PatternTask(seed=1)
    prompt = task.prompt(index)
    want = encode(task.pattern_of(prompt))
    body = response[: response.index(EOS)] if EOS in response else response
    body = body[: task.credit_len]
    matches = sum(t == want[i % len(want)] for i, t in enumerate(body))
    run = next((i for i, t in enumerate(body) if t != want[i % len(want)]), len(body))
    assert task.reward(prompt, response) == 0.5 * (matches + run)
    if EOS not in response and len(response) < task.credit_len:
        extended = [*response, want[len(response) % len(want)]]
        assert task.reward(prompt, extended) > task.reward(prompt, response)


def test_random_policy_scores_above_zero() -> None:
    """A uniform policy over the task vocabulary (what an untrained model samples) earns a
    nonzero mean reward: the signal RL starts from."""
    task = PatternTask()
    rng = np.random.default_rng(0)
    scores = [task.reward(task.prompt(i), rng.integers(0, VOCAB_SIZE, size=64).tolist())
              for i in range(400)]
    assert 0.1 < float(np.mean(scores)) < 1.5 and float(np.mean(np.array(scores) > 0)) > 0.3


@given(st.integers(1, 50), st.integers(0, 200), st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_sample_order_is_plan_independent(n: int, start: int, dp: int) -> None:
    order = SampleOrder(n, seed=7)
    batch = 8
    whole = order.indices(start, batch)
    parts = []
    for r in range(dp):
        a, b = replica_slice(batch, dp, r)
        parts.append(order.indices(start + a, b - a))
    assert np.array_equal(np.concatenate(parts), whole)
    # One epoch visits every prompt exactly once.
    epoch = order.indices((start // n) * n, n)
    assert sorted(epoch.tolist()) == list(range(n))
