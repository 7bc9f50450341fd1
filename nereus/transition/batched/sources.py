"""Where a model-stage's Extends copy from: the broadcast heap of :func:`local.local_dag`
replayed a round at a time, and the donor choice of :func:`local._pick_donor`, on GPU arrays.

The heap's keys are ``(free_at, tie)`` and every item pushed while the items of round F are popped
has a round above F, so the items of one round leave in tie order (pool items first, in pool
order, then pushes in push order) and a round is one slice.
"""

from __future__ import annotations

import numpy as np

from nereus.emu.unit import Layout
from nereus.transition.batched.blocks import (
    EMPTY,
    INTERLEAVED,
    NONE,
    iota,
    minus_ones,
    none_array,
    row_any,
    sub_index,
)


def heap_rounds(pool: np.ndarray, pool_free: np.ndarray, slots: np.ndarray,
                 blocked: np.ndarray, donor: int) -> tuple[np.ndarray, np.ndarray]:
    """The source unit of each Extend in slot order as the heap of :func:`local.local_dag`
    pops them, and the Extend (position) that read the same unit last (:data:`NONE`: none).

    Keys are ``(free_at, tie)`` and every push while round F is popped lands in a later round,
    so round F is its items in tie order: pool items first, then pushes in push order (a
    source, then the slot it filled). Pushes of round 0 (blocked slots) and of round 1 meet in
    round 2; from round 3 on a round is the last round's sources and slots interleaved."""
    n_slots = slots.size
    out = np.empty(n_slots, dtype=np.int64)
    prev = np.empty(n_slots, dtype=np.int64)
    if not n_slots:
        return out, prev
    if donor >= 0 and pool.size == 1:  # the donor alone (the pool is nothing else then)
        out[0], prev[0] = donor, NONE
        if n_slots > 1:  # read once: then the first slot doubles, each Extend j >= 1 reading
            # its parent j >> 1 (odd j: the slot that parent filled; even j: what it read)
            j = iota(1, n_slots)
            odd = j // (j & -j)  # j without its trailing zero bits
            out[1:] = slots[odd >> 1]
            prev[1::2] = NONE
            prev[2::2] = iota(1, 1 + (n_slots - 1) // 2)
        return out, prev
    if pool.size >= n_slots:  # the pool alone fills every slot: rounds 0 and 1, nothing read twice
        out[:] = np.concatenate([pool[~pool_free], pool[pool_free]])[:n_slots]
        prev.fill(NONE)
        return out, prev
    return replay_rounds(pool, pool_free, slots, blocked, donor, out, prev)


def replay_rounds(pool: np.ndarray, pool_free: np.ndarray, slots: np.ndarray, blocked: np.ndarray,
            donor: int, out: np.ndarray, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`heap_rounds` a round at a time (any pool)."""
    n_slots = slots.size
    p0, p1 = pool[~pool_free], pool[pool_free]
    rounds: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {
        0: [(p0, none_array(p0.size))], 1: [(p1, none_array(p1.size))]}
    pos = 0
    f = 0
    items = last = EMPTY
    while pos < n_slots:
        chunks = rounds.pop(f, [])
        if len(chunks) == 1:
            items, last = chunks[0]
        elif chunks:
            items = np.concatenate([c[0] for c in chunks])
            last = np.concatenate([c[1] for c in chunks])
        else:
            items = last = EMPTY
        if f >= 3 and not rounds:
            break
        f += 1
        if not items.size:
            continue
        q = min(items.size, n_slots - pos)
        src = items[:q]
        out[pos:pos + q] = src
        prev[pos:pos + q] = last[:q]
        nxt = np.empty(2 * q, dtype=np.int64)
        nxt[0::2] = src
        nxt[1::2] = slots[pos:pos + q]
        nlast = none_array(2 * q)
        nlast[0::2] = iota(pos, pos + q)
        if f == 1:  # round 0: a blocked slot starts at 1, so both land in round 2
            late = blocked[pos:pos + q].repeat(2)
        if donor >= 0 and f <= 2:  # the donor is read once
            keep = nxt != donor
            nxt, nlast = nxt[keep], nlast[keep]
            if f == 1:
                late = late[keep]
        pos += q
        if f == 1 and np.count_nonzero(late):
            early = ~late
            rounds.setdefault(1, []).append((nxt[early], nlast[early]))
            rounds.setdefault(2, []).append((nxt[late], nlast[late]))
        else:
            rounds.setdefault(f, []).append((nxt, nlast))
    if pos >= n_slots:
        return out, prev
    # pure doubling: the next round is this round's sources and slots interleaved, written
    # straight after it (its even places read this round's Extends, its odd places nothing)
    q = min(items.size, n_slots - pos)
    out[pos:pos + q] = items[:q]
    prev[pos:pos + q] = last[:q]
    _double(out, prev, slots, pos, q)
    return out, prev


def _double(out: np.ndarray, prev: np.ndarray, slots: np.ndarray, pos: int, q: int) -> None:
    """Fills ``out``/``prev`` after the round at ``pos`` (``q`` Extends) by pure doubling."""
    n_slots = slots.size
    while pos + q < n_slots:
        start = pos + q
        k = min(2 * q, n_slots - start)
        h = (k + 1) // 2
        out[start:start + k:2] = out[pos:pos + h]
        out[start + 1:start + k:2] = slots[pos:pos + k // 2]
        prev[start:start + k:2] = iota(pos, pos + h)
        prev[start + 1:start + k:2] = NONE
        pos, q = start, k


def pick_donor(
    unit_rows: np.ndarray,
    surplus: np.ndarray,
    whole: np.ndarray,
    unfilled_rows: np.ndarray,
    blocked: np.ndarray,
    held: np.ndarray,
    others_need: np.ndarray,
    rank: int,
    ls: Layout,
    t_sub: Layout,
) -> tuple[int, int] | None:
    """:func:`local._pick_donor`: ``(-1, k)`` for ``surplus[k]``, ``(w, j)`` for sub-unit j
    (interleaved) of ``whole[w]``; None when fewer than ``rank + 1`` candidates.

    Slots are pairwise disjoint, so a candidate of s GPUs misses some slot of a kind whenever
    there are more than s of them."""
    s = t_sub.tp * t_sub.pp
    n_held = int(np.count_nonzero(blocked))
    n_free = blocked.size - n_held
    size = held.shape[0]

    def misses(rows: np.ndarray, held_slots: bool, count: int) -> np.ndarray | bool:
        """Per row: whether it misses some unfilled slot of the kind (a bool for all rows)."""
        if count > s:
            return True
        if not count:
            return False
        ids = minus_ones(size)
        ids[unfilled_rows.compress(blocked if held_slots else ~blocked, axis=0)] = \
            iota(0, count)[:, None]
        out: np.ndarray = _distinct(ids.take(rows)) < count
        return out

    def key(rows: np.ndarray, kind: int) -> np.ndarray:
        """kind·4 + fit·2 + (no other target needs it); -1: not a candidate."""
        if not rows.shape[0]:
            return EMPTY
        free = ~row_any(others_need.take(rows))
        m_free = misses(rows, False, n_free)
        if m_free is True:  # fit 1 throughout
            return free + (kind * 4 + 2)
        m_held = misses(rows, True, n_held)
        if m_free is False and m_held is True:  # fit 0 throughout
            return free + kind * 4
        if m_free is False and m_held is False:
            return np.full(rows.shape[0], -1, dtype=np.int64)
        fit = np.where(m_free, 1, np.where(m_held, 0, -1))
        out: np.ndarray = kind * 4 + fit * 2 + free
        out[fit < 0] = -1
        return out

    k1 = key(unit_rows.take(surplus, axis=0), 1)
    if whole.shape[0]:
        wi = sub_index(ls.tp, ls.pp, t_sub.tp, t_sub.pp, INTERLEAVED)
        k0 = key(whole.take(wi, axis=1).reshape(-1, s), 0)
    else:
        k0 = EMPTY
    keys = np.concatenate([k1, k0])
    if not keys.size:
        return None
    if rank == 0:  # the first of the best
        k = int(keys.argmax())
        if keys[k] < 0:
            return None
    else:
        ok = (keys >= 0).nonzero()[0]
        if rank >= ok.size:
            return None
        k = int(ok[np.argsort(-keys[ok], kind="stable")[rank]])
    if k < k1.size:
        return -1, k
    per = (ls.tp // t_sub.tp) * (ls.pp // t_sub.pp)
    return (k - k1.size) // per, (k - k1.size) % per


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Per row: how many distinct non-negative ids it holds."""
    srt = np.sort(ids, axis=1)
    out = (srt[:, 0] >= 0).astype(np.int64)
    if srt.shape[1] > 1:
        out += ((srt[:, 1:] != srt[:, :-1]) & (srt[:, 1:] >= 0)).sum(1)
    return out
