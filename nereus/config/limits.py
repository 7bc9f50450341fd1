"""Named limits on what a user may give Nereus: sizes of input files, shapes of YAML documents,
and numeric ranges. An input beyond one is refused with a one-line error that names the limit.

They bound the work and memory an input can ask for (a config that expands to a billion
values, a cluster of 10**30 nodes, a simulation of 10**12 steps), not what the planner or the
runtime are known to handle well: each is far above every configuration Nereus is used with.
"""

from __future__ import annotations

# -- input files ----------------------------------------------------------------------------
MAX_CONFIG_BYTES = 1 << 20  # a YAML job config (the examples are about 2 KB)
MAX_TRACE_BYTES = 16 << 20  # a GPU (spot, fault) or length trace (the shipped ones: < 200 KB)
MAX_CALIBRATION_BYTES = 1 << 20  # a saved calibration (JSON)
# a checkpoint's config.json, safetensors index, generation or tokenizer config (a 405B model's
# index is about 100 KB)
MAX_CHECKPOINT_JSON_BYTES = 16 << 20

# -- YAML documents ----------------------------------------------------------------
MAX_YAML_DEPTH = 32  # nested mappings and lists (the examples nest 4 deep)
MAX_YAML_VALUES = 20_000  # scalars and collections, every alias expanded (a bomb stops here)

# -- numbers ------------------------------------------------------------------------------------
MAX_INT = 2**31 - 1  # any integer a config or a flag gives, unless a tighter limit applies
MAX_NUMBER = 1e15  # any float a config or a flag gives, unless a tighter limit applies
MAX_SEED = 2**63 - 1
MAX_GPUS = 65_536  # GPUs of a planned or simulated cluster (nodes × gpus_per_node)
MAX_GPUS_PER_NODE = 1_024
MAX_RANKS = 4_096  # MPI ranks of ``nereus run`` (each one process playing one GPU)
MAX_STEPS = 1_000_000  # RL steps of ``nereus run`` and of a trace's step column
MAX_SIM_STEPS = 100_000  # steps of ``nereus simulate`` (the paper's long run has 1,000)
MAX_TOKENS = 1 << 24  # a sequence length, prompt or generated, in tokens
MAX_MEMORY_GB = 1e6  # memory of one GPU or virtual device, in GB
MAX_TIMEOUT_S = 30 * 86_400.0  # a wall-clock limit (30 days)
MAX_TRACE_DAYS = 36_525.0  # a fault trace's event time (100 years)
MAX_TICK_S = 7 * 86_400.0  # a spot trace's gap between two availability samples
MAX_TARGETS = 16  # candidate targets a replan plans transitions for (controller.targets)


def named(name: str, value: float) -> str:
    """``"65,536 (MAX_GPUS)"``: a limit as an error message names it."""
    whole = isinstance(value, int) or (value.is_integer() and abs(value) < 1e15)
    shown = f"{int(value):,}" if whole else f"{value:g}"
    return f"{shown} ({name})"
