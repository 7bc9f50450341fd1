"""Exact reference: the plan-search problem as a MILP, solved by HiGHS (``scipy.optimize.milp``).

Optional: needs the ``nereus[solver]`` extra (scipy, which bundles HiGHS). The solver is imported
inside ``solve`` only, so the pure core imports without it. Same plan space and feasibility as
the DP (``nereus.plan.problem``), over every feasible candidate, not only frontier ones:

- binary ``x[M,c]``, ``Σ_c x[M,c] = 1`` for every model-stage M;
- phase latency ``T_φ ≥ Σ_c L_c·x[M,c]`` (scaled to O(1)) for every M in φ; step ``Z ≥ Σ_{φ ∈ l} T_φ`` per lane;
- GPU budgets: per lane, phase and level s ``Σ_{M ∈ φ} Σ_c d_c[s]·x[M,c] ≤ D[l,s]`` and
  ``Σ_l D[l,s] ≤ cap_s``;
- memory: ``P_φ ≥ Σ_c P_c·x``, ``PT_φ ≥ Σ_c PT_c·x`` for M in φ, and per lane and phase φ*
  ``PT_φ* + Σ_{φ ≠ φ*} P_φ ≤ capacity`` (bytes scaled to GB);
- minimize Z.

The solver's wall-clock time cap is the only clock here; a run stopped by it returns its best
plan so far with ``optimal = False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nereus.plan.candidates import Costed
from nereus.plan.problem import Problem, is_feasible

GB = 1e9
# Right-hand-side margins (GB) tried when the solver's tolerance lets a plan pass the bound by a
# few bytes; the first is the exact problem.
MEMORY_MARGINS_GB = (0.0, 1e-5, 1e-3)


@dataclass(frozen=True)
class MilpOutcome:
    choice: dict[str, Costed] | None
    optimal: bool  # proven optimal (mip gap 0) within the time cap
    status: str
    variables: int
    constraints: int


def solve(problem: Problem, time_limit_s: float) -> dict[str, Costed] | None:
    """The MILP's plan (optimal unless the time cap stopped it), or None if infeasible."""
    return solve_detailed(problem, time_limit_s).choice


def solve_detailed(problem: Problem, time_limit_s: float) -> MilpOutcome:
    out = MilpOutcome(None, True, "infeasible", 0, 0)
    for margin in MEMORY_MARGINS_GB:
        out = _solve_once(problem, time_limit_s, margin)
        if out.choice is None or is_feasible(problem, out.choice):
            return out
    return MilpOutcome(None, False, "tolerance", out.variables, out.constraints)


def _solve_once(problem: Problem, time_limit_s: float, margin_gb: float) -> MilpOutcome:
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    wf = problem.workflow
    spaces = {s.name: s.feasible for s in problem.spaces}
    col: dict[tuple[str, int], int] = {}
    n = 0
    for name in wf.names:
        for i in range(len(spaces[name])):
            col[(name, i)] = n
            n += 1
    n_x = n
    phases = [(li, ph) for li, lane in enumerate(wf.lanes) for ph in lane]
    t_col = {k: n + k for k in range(len(phases))}
    n += len(phases)
    p_col = {k: n + k for k in range(len(phases))}
    n += len(phases)
    pt_col = {k: n + k for k in range(len(phases))}
    n += len(phases)
    nl = len(problem.levels)
    d_col = {(li, s): n + li * nl + s for li in range(len(wf.lanes)) for s in range(nl)}
    n += len(wf.lanes) * nl
    z_col = n
    n += 1

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    inf = float("inf")
    # Latencies in units of the slowest model-stage's fastest candidate, so the objective is
    # O(1) whatever the model size (HiGHS has an absolute gap tolerance).
    scale_s = max((min(c.latency_s for c in spaces[m]) for m in wf.names if spaces[m]), default=1.0)
    scale_s = scale_s if scale_s > 0 else 1.0
    demand = {name: [problem.demand(c) for c in spaces[name]] for name in wf.names}
    for name in wf.names:
        row([(col[(name, i)], 1.0) for i in range(len(spaces[name]))], 1.0, 1.0)
    for k, (li, phase) in enumerate(phases):
        for name in phase:
            cs = spaces[name]
            row([(t_col[k], 1.0)] + [(col[(name, i)], -c.latency_s / scale_s) for i, c in enumerate(cs)], 0.0, inf)
            row([(p_col[k], 1.0)] + [(col[(name, i)], -c.persistent_bytes / GB) for i, c in enumerate(cs)], 0.0, inf)
            row([(pt_col[k], 1.0)] + [(col[(name, i)], -c.peak_bytes / GB) for i, c in enumerate(cs)], 0.0, inf)
        for s in range(nl):
            entries = [(d_col[(li, s)], 1.0)]
            for name in phase:
                entries += [(col[(name, i)], -float(d[s])) for i, d in enumerate(demand[name]) if d[s]]
            row(entries, 0.0, inf)
    cap_gb = problem.capacity_bytes / GB - margin_gb
    for li in range(len(wf.lanes)):
        ks = [k for k, (lj, _) in enumerate(phases) if lj == li]
        row([(z_col, 1.0)] + [(t_col[k], -1.0) for k in ks], 0.0, inf)
        for k_star in ks:
            row([(pt_col[k_star], 1.0)] + [(p_col[k], 1.0) for k in ks if k != k_star], -inf, cap_gb)
    for s in range(nl):
        row([(d_col[(li, s)], 1.0) for li in range(len(wf.lanes))], -inf, float(problem.caps[s]))

    objective = np.zeros(n)
    objective[z_col] = 1.0
    integrality = np.zeros(n)
    integrality[:n_x] = 1
    upper = np.full(n, np.inf)
    upper[:n_x] = 1.0
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    options: dict[str, Any] = {"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "disp": False}
    res = milp(
        objective,
        integrality=integrality,
        bounds=Bounds(np.zeros(n), upper),
        constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
        options=options,
    )
    if res.x is None:
        return MilpOutcome(None, res.status == 2, str(res.message), n, len(lo))
    choice: dict[str, Costed] = {}
    for name in wf.names:
        xs = [res.x[col[(name, i)]] for i in range(len(spaces[name]))]
        best = max(range(len(xs)), key=lambda i: xs[i])
        choice[name] = spaces[name][best]
    return MilpOutcome(choice, res.status == 0, str(res.message), n, len(lo))
