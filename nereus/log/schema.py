"""The run-log schema as plain data: file attributes, tables, columns, dtypes and units.

One HDF5 file per run segment. Every table is a 1-D resizable chunked dataset of a compound
dtype, so that a row is appended (and becomes visible to a SWMR reader) as one unit. Variable-size
values (plans, DAGs, candidates, details) are JSON, stored as bytes in the shared ``/json_heap``
uint8 dataset and referenced from a row by a ``<name>_off`` (uint64) / ``<name>_len`` (uint32)
column pair: HDF5 does not support variable-length types under SWMR, plain chunked appends it
does. docs/log_schema.md describes every column; this module is its source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMAT_NAME = "nereus-run-log"
SCHEMA_VERSION = 3  # 2: stage_times and fixed_costs (live calibration); 3: metrics, batches,
#                     samples, validation (the data, rewards and validation of nereus run)

# Root attributes.
ATTR_FORMAT = "nereus_log_format"  # == FORMAT_NAME
ATTR_VERSION = "nereus_log_version"  # == SCHEMA_VERSION
ATTR_CREATED = "created_unix_s"
ATTR_NEREUS_VERSION = "nereus_version"

# Group /run: attributes only (written before SWMR starts, never changed afterwards).
RUN_GROUP = "run"
ATTR_META_JSON = "meta_json"
ATTR_CONFIG_JSON = "config_json"
ATTR_INITIAL_PLAN_JSON = "initial_plan_json"  # "null" when not given

HEAP = "json_heap"  # uint8, the bytes of every JSON value, UTF-8
HEAP_CHUNK_BYTES = 65536

# Every row has committed = 1; the fill value 0 marks a row whose extent reached the file but whose
# data did not (a writer killed between a resize and its flush). Readers drop such rows at a tail.
COMMITTED = "committed"

# Identifier columns are fixed-length ASCII strings of this many bytes.
NAME_BYTES = 32

# Controller paths (nereus.control.admission): "restart" is the urgent fallback to
# checkpoint/restart, "initial" the first plan, "none" an urgent replan that found nothing.
ADMISSION_PATHS = ("urgent", "opportunistic", "restart", "initial", "none")

# Event kinds the runtime and the writer emit; others are allowed if they are short identifiers.
KNOWN_EVENT_KINDS = (
    "run-start",
    "run-end",
    "gpu-pool-change",
    "node-failure",
    "oom",
    "checkpoint",
    "restart",
    "preemption-warning",
)
RUN_END = "run-end"


@dataclass(frozen=True)
class Column:
    """One column of a table: ``kind`` is ``i8 i4 u1 f8 bool name json``; ``json`` is two fields."""

    name: str
    kind: str
    unit: str
    meaning: str


@dataclass(frozen=True)
class Table:
    name: str
    chunk_rows: int
    meaning: str
    columns: tuple[Column, ...]
    since: int = 1  # the schema version that added it (an older log reads it as empty)

    @property
    def json_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.kind == "json")


_STEP = Column("step", "i8", "", "RL step (0-based) of the record; -1 = before the first step")

TABLES: tuple[Table, ...] = (
    Table(
        "steps",
        256,
        "one row per finished RL step, appended before the per-step flush",
        (
            _STEP,
            Column("wall_time_s", "f8", "s since the Unix epoch", "wall-clock time at step end"),
            Column("step_s", "f8", "s", "step latency, excluding any transition after the step"),
            Column("gen_len_mean", "f8", "tokens", "mean generated length"),
            Column("gen_len_p95", "f8", "tokens", "95th percentile generated length"),
            Column("pool_gpus", "i4", "GPUs", "size of the GPU pool during the step"),
            Column("reward", "f8", "", "mean reward (NaN when unknown)"),
            Column("tokens", "i8", "tokens", "tokens generated in the step"),
            Column(
                "plan_version",
                "i4",
                "",
                "plan in force: 0 = initial plan, k = plan of the k-th transition",
            ),
            Column("stage_s", "json", "s", "object: model-stage name -> measured seconds"),
        ),
    ),
    Table(
        "gpu_memory",
        1024,
        "peak memory per GPU per step (one row per GPU and step)",
        (
            _STEP,
            Column("global_gpu", "i4", "", "global GPU id = node * gpus_per_node + local id"),
            Column("peak_bytes", "i8", "bytes", "peak allocated memory in the step"),
        ),
    ),
    Table(
        "calibration_samples",
        512,
        "measured op-level samples that calibration consumes",
        (
            _STEP,
            Column("hardware", "name", "", "hardware preset name (e.g. h200)"),
            Column(
                "op_class", "name", "", "operation class (gemm, attention, allreduce-intra, ...)"
            ),
            Column("ideal_s", "f8", "s", "roofline time at 100% efficiency"),
            Column("measured_s", "f8", "s", "measured time"),
        ),
    ),
    Table(
        "efficiencies",
        256,
        "calibrated efficiency per (hardware, op class) after an update",
        (
            _STEP,
            Column("hardware", "name", "", "hardware preset name"),
            Column("op_class", "name", "", "operation class"),
            Column("efficiency", "f8", "fraction", "ideal_s / measured_s estimate, in (0, 1]"),
        ),
    ),
    Table(
        "replans",
        64,
        "one row per replan the controller ran",
        (
            _STEP,
            Column("trigger", "name", "", "what fired: gpu-pool-change, memory, drift-length, ..."),
            Column("candidates", "json", "", "candidate plans considered (list)"),
            Column("predicted_s", "json", "s", "predicted step latency per candidate"),
            Column(
                "predicted_memory_bytes", "json", "bytes", "predicted peak memory per candidate"
            ),
        ),
    ),
    Table(
        "admissions",
        64,
        "one row per admission decision",
        (
            _STEP,
            Column("admitted", "bool", "", "whether the new plan was admitted"),
            Column("path", "name", "", "urgent, opportunistic, restart, initial or none"),
            Column("reason", "json", "", "why (a JSON string or object)"),
            Column("delta_l_s", "f8", "s", "predicted per-step latency gain L_cur - L_new"),
            Column("transition_s", "f8", "s", "predicted transition time"),
            Column("horizon_steps", "f8", "steps", "H_x, expected steps until the next crossing"),
        ),
    ),
    Table(
        "transitions",
        64,
        "one row per executed transition; the new plan is in force from step + 1",
        (
            _STEP,
            Column("transfer_bytes", "i8", "bytes", "bytes moved between GPUs"),
            Column("predicted_s", "f8", "s", "predicted transition time"),
            Column("measured_s", "f8", "s", "measured transition time"),
            Column("dag", "json", "", "the transition DAG (nodes and edges)"),
            Column("primitives", "json", "", "primitives executed (list)"),
            Column("plan", "json", "", "the plan in force after the transition (or null)"),
        ),
    ),
    Table(
        "events",
        64,
        "runtime events: run-start, run-end, gpu-pool-change, node-failure, oom, ...",
        (
            _STEP,
            Column("time_s", "f8", "s since the Unix epoch", "wall-clock time of the event"),
            Column("kind", "name", "", "event kind"),
            Column("detail", "json", "", "event details (object)"),
        ),
    ),
    Table(
        "stage_times",
        256,
        "predicted against measured time of each model-stage per step",
        (
            _STEP,
            Column("model_stage", "name", "", "model-stage"),
            Column("predicted_s", "f8", "s", "the cost model's time under the calibration the "
                   "step ran with"),
            Column("measured_s", "f8", "s", "measured time (slowest rank)"),
        ),
        since=2,
    ),
    Table(
        "fixed_costs",
        256,
        "calibrated fixed cost per (hardware, event) after an update",
        (
            _STEP,
            Column("hardware", "name", "", "hardware preset name"),
            Column("event", "name", "", "event (layer-pass, decode-layer, unit-build, ...)"),
            Column("seconds", "f8", "s", "seconds per event"),
        ),
        since=2,
    ),
    Table(
        "metrics",
        256,
        "per-step scalars beyond /steps: losses, KL, reward-model score, reward failures",
        (
            _STEP,
            Column("name", "name", "", "metric (loss/actor-train, loss/critic-train, kl, "
                   "reward/model_score, reward/errors)"),
            Column("value", "f8", "", "its value in the step"),
        ),
        since=3,
    ),
    Table(
        "batches",
        256,
        "one row per finished step: the prompts it took and every response's reward",
        (
            _STEP,
            Column("epoch", "i8", "epochs", "epoch of the step's first prompt in the sample order"),
            Column("position", "i8", "prompts", "prompts consumed before the step"),
            Column("errors", "i4", "responses", "responses scored 0 after reward.fn failed "
                   "(reward.on_error: zero)"),
            Column("rows", "json", "", "list: each prompt's row in data.train (0-based), in "
                   "the step's order"),
            Column("rewards", "json", "", "list: each response's reward, in the step's order "
                   "(response i answers prompt i // samples_per_prompt)"),
        ),
        since=3,
    ),
    Table(
        "samples",
        256,
        "a few responses of each step as text (runtime.log_samples), with their rewards",
        (
            _STEP,
            Column("seq", "i4", "", "the response's index in the step"),
            Column("row", "i8", "", "its prompt's row in data.train (0-based)"),
            Column("reward", "f8", "", "its reward"),
            Column("response", "json", "", "string: the decoded response (special tokens "
                   "skipped), what reward.fn scored"),
        ),
        since=3,
    ),
    Table(
        "validation",
        64,
        "one row per validation run (runtime.val_every) after a step",
        (
            _STEP,
            Column("prompts", "i4", "prompts", "validation prompts"),
            Column("reward", "f8", "", "mean reward of the greedy responses"),
            Column("pass_at_1", "f8", "fraction", "greedy responses whose reward reaches "
                   "reward.pass_threshold"),
            Column("len_mean", "f8", "tokens", "mean length of the greedy responses"),
            Column("samples", "i4", "", "sampled responses per prompt (runtime.val_samples; "
                   "0: none)"),
            Column("sampled_reward", "f8", "", "mean reward of the sampled responses (NaN: "
                   "none)"),
            Column("sampled_pass_at_1", "f8", "fraction", "sampled responses that pass (NaN: "
                   "none)"),
            Column("pass_at_k", "f8", "fraction", "prompts with at least one passing sampled "
                   "response (NaN: none)"),
            Column("errors", "i4", "responses", "responses scored 0 after reward.fn failed"),
            Column("seconds", "f8", "s", "time the validation took"),
            Column("detail", "json", "", "object: per-prompt greedy rewards and lengths, "
                   "responses_sha256 (of every greedy response's ids)"),
        ),
        since=3,
    ),
)

TABLE_BY_NAME = {t.name: t for t in TABLES}


def field_names(table: Table) -> tuple[str, ...]:
    """The compound-dtype field names of a table, in order (json columns as _off/_len pairs)."""
    names: list[str] = []
    for c in table.columns:
        if c.kind == "json":
            names += [f"{c.name}_off", f"{c.name}_len"]
        else:
            names.append(c.name)
    names.append(COMMITTED)
    return tuple(names)


_NUMPY_KIND = {
    "i8": "<i8",
    "i4": "<i4",
    "u1": "u1",
    "f8": "<f8",
    "bool": "?",
    "name": f"S{NAME_BYTES}",
}


def compound_dtype(table: Table) -> np.dtype:
    """The numpy compound dtype of one table row (h5py maps bool to an HDF5 enum FALSE/TRUE)."""
    fields: list[tuple[str, str]] = []
    for c in table.columns:
        if c.kind == "json":
            fields += [(f"{c.name}_off", "<u8"), (f"{c.name}_len", "<u4")]
        else:
            fields.append((c.name, _NUMPY_KIND[c.kind]))
    fields.append((COMMITTED, "u1"))
    return np.dtype(fields)
