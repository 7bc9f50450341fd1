"""Plan search (pure core, DESIGN.md §3).

``candidates`` (plan space, costs, frontier), ``problem`` (budgets, memory bound, objective),
``dp`` (the frontier DP), ``exhaustive`` and ``milp`` (exact references; the MILP needs the
``nereus[solver]`` extra), ``assign`` (node-aware GPU placement), ``search`` (``search_plan``),
``explain`` (text and JSON).
"""
