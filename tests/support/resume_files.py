"""Checkpoints, rank dumps and run logs of a job as ``nereus run`` writes them, made without
running it (for the resume checks: tests/pure/test_resume_check.py and the bad-input corpus):
the arrays at the shapes of the config's models, the metadata with the job's fingerprint."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from nereus.config.load import load_config
from nereus.config.run import parse_runtime
from nereus.runtime.failures.checkpoint import FIELDS, save_global
from nereus.runtime.failures.dumps import write_rank_dump
from nereus.runtime.failures.resume_check import expected_for, run_fingerprint


def job_of(config: Path, steps: int | None = None) -> tuple[Any, Any, Any]:
    """(run options, setup, fingerprint) of ``config`` as ``nereus run`` reads it."""
    cfg = load_config(str(config))
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup, steps=steps)
    return rc, setup, run_fingerprint(cfg, rc)


def _counters(updates: int) -> Any:
    return SimpleNamespace(updates=updates, model_stage_version=0, policy_version=updates,
                           position=updates)


def state(setup: Any, fill: float = 0.0) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """Every model-stage's state at the config's shapes (float32, ``fill`` everywhere)."""
    shapes = expected_for(setup, None).shapes
    return {ms: {f: {t: np.full(shp, fill, dtype=np.float32) for t, shp in tensors.items()}
                 for f in FIELDS} for ms, tensors in shapes.items()}


def write_checkpoint(directory: Path, config: Path, log: Path, step: int,
                     fingerprint: Any = None, **meta: Any) -> Path:
    """``step-<step>.npz`` in ``directory`` for the job ``config`` continuing ``log``;
    ``fingerprint``: another than the config's; ``meta``: metadata fields to add or replace."""
    _, setup, fp = job_of(config)
    globs = state(setup, fill=float(step))
    counters = {ms: (_counters(2 * step), float(2 * step)) for ms in globs}
    history = {"rows": [{"step": s, "reward": 0.0} for s in range(step)], "transitions": 0,
               "transition_s": 0.0}
    extra = {"plan": None, "log": str(log), "segment": "1-1", "controller": None,
             "fingerprint": (fingerprint or fp).to_dict(), **meta}
    return Path(save_global(str(directory), step, globs, counters, history, extra))


def write_log(path: Path, fingerprint: Any) -> Path:
    """A closed run log of one segment recording ``fingerprint`` (None: none, as before)."""
    from nereus.log.writer import RunLogWriter

    job = {} if fingerprint is None else {"fingerprint": fingerprint.to_dict()}
    with RunLogWriter(path, {"command": "nereus run", **job}, {}, start=job) as w:
        for s in range(2):
            w.log_step(s, step_s=1.0, pool_gpus=2, peak_memory_bytes=[1, 1])
    return path


def write_dump(directory: Path, config: Path, log: Path, step: int, segment: str = "9-9",
               fingerprint: Any = None) -> list[Path]:
    """The rank dumps of a preempted run of ``config`` (one rank per GPU of its plan, the plan
    every model-stage on rank 0's replica): boundary ``step``, restorable."""
    _, setup, fp = job_of(config)
    globs = state(setup, fill=float(step))
    ranks = setup.cluster.num_gpus
    plan = SimpleNamespace(to_dict=lambda: {"stages": [
        {"name": ms, "tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "grad_accum": 1,
         "replicas": [[0]]} for ms in globs]})
    held = {ms: {0: ([(f, t, (0,) * a.ndim, a.shape, a) for f, d in g.items()
                      for t, a in d.items()], (_counters(step), float(step)))}
            for ms, g in globs.items()}
    paths = []
    for rank in range(ranks):
        b = SimpleNamespace(step=step, version=0, plan=plan, held=held if rank == 0 else {})
        job = {"log": str(log), "fingerprint": (fingerprint or fp).to_dict()}
        paths.append(Path(write_rank_dump(str(directory), segment, rank, [b], {}, "test",
                                          job=job)))
    return paths


# ---- the bad-input corpus's setups (tests/ranks/test_bad_inputs.py): each makes or damages
# ---- the micro job's files in the case's folder ``d`` (the log: d/run.h5, its checkpoint
# ---- folder d/run.h5.ckpt, the newest checkpoint step 2)

def _job() -> Path:
    from support.bad_inputs import CORPUS

    return CORPUS / "resume_job.yaml"


def _ck(d: Path) -> Path:
    return d / "run.h5.ckpt" / "step-00000002.npz"


def _other(fp: Any, edit: Any) -> Any:
    """``fp`` with its parts edited by ``edit(parts)`` (a fingerprint of another job)."""
    from nereus.config.fingerprint import Fingerprint

    parts = fp.to_dict()["parts"]
    edit(parts)
    return Fingerprint.of(parts)


def _rewrite(path: Path, meta_edit: Any = None, arrays_edit: Any = None) -> None:
    """Write the archive ``path`` again with its metadata and arrays edited."""
    import json

    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays.pop("__meta__")).decode())
    if meta_edit is not None:
        meta_edit(meta)
    if arrays_edit is not None:
        arrays_edit(arrays)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path.unlink()
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def resume(d: Path, log: Path) -> None:
    """The log of the micro job and its newest checkpoint, step 2 (both usable)."""
    _, _, fp = job_of(_job())
    write_log(d / "run.h5", fp)
    write_checkpoint(d / "run.h5.ckpt", _job(), d / "run.h5", 2)


def resume_dump(d: Path, log: Path) -> None:
    """The log of the micro job and the rank dumps of a preemption (no checkpoint)."""
    _, _, fp = job_of(_job())
    write_log(d / "run.h5", fp)
    write_dump(d / "run.h5.ckpt", _job(), d / "run.h5", 2)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_in_array(path: Path) -> None:
    """One byte of an array's data changed (its member then fails the CRC check)."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = max(zf.infolist(), key=lambda i: i.file_size)
        with open(path, "rb") as fh:
            fh.seek(info.header_offset + 26)
            name_len, extra_len = (int.from_bytes(fh.read(2), "little") for _ in range(2))
    at = info.header_offset + 30 + name_len + extra_len + info.compress_size - 8
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _drop(prefix: str) -> Any:
    def edit(arrays: dict[str, Any]) -> None:
        for k in [k for k in arrays if k.startswith(prefix)]:
            del arrays[k]
    return edit


def _reshape_first(arrays: dict[str, Any]) -> None:
    key = sorted(k for k in arrays if k.startswith("actor-train/param/"))[0]
    arrays[key] = np.zeros((3, 5), dtype=np.float32)


def _seed_7(parts: dict[str, Any]) -> None:
    parts["seed"] = 7
    parts["data"]["seed"] = 7


def _wide(parts: dict[str, Any]) -> None:
    parts["models"]["actor"]["hidden_size"] = 32


def _set(**fields: Any) -> Any:
    def edit(meta: dict[str, Any]) -> None:
        meta.update(fields)
    return edit


def _foreign(d: Path, edit: Any) -> Any:
    _, _, fp = job_of(_job())
    return _other(fp, edit).to_dict()


def _pickled(path: Path) -> None:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["actor-gen/param/extra"] = np.array([{"x": 1}], dtype=object)
    path.unlink()
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _edit_fingerprint(meta: dict[str, Any]) -> None:
    meta["fingerprint"]["parts"]["seed"] = 1  # the digest no longer matches


def _older_torn(d: Path) -> None:
    older = d / "run.h5.ckpt" / "step-00000001.npz"
    older.write_bytes(_ck(d).read_bytes()[:100])


def _dump_rank(d: Path, rank: int) -> Path:
    return d / "run.h5.ckpt" / "dump-9-9" / f"rank-{rank}.npz"


def _dump_piece_missing(meta: dict[str, Any]) -> None:
    meta["boundaries"][0]["held"]["actor-gen"]["0"]["pieces"][0][4] = "no/such/key"


def _ck_replace(d: Path, content: Any) -> None:
    ck = _ck(d)
    ck.unlink()
    content(ck)


def _npy(path: Path) -> None:
    with open(path, "wb") as fh:
        np.save(fh, np.zeros(3))


def _npz(path: Path, **arrays: Any) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


RESUME_SETUPS: dict[str, Any] = {
    "resume": resume,
    "resume_dump": resume_dump,
    "ck_truncated": lambda d, log: _truncate(_ck(d)),
    "ck_text": lambda d, log: _ck(d).write_text("not a checkpoint\n"),
    "ck_npy": lambda d, log: _ck_replace(d, _npy),
    "ck_no_meta": lambda d, log: _ck_replace(d, lambda p: _npz(p, x=np.zeros(3))),
    "ck_meta_not_json": lambda d, log: _ck_replace(d, lambda p: _npz(
        p, __meta__=np.frombuffer(b"\xff{", dtype=np.uint8))),
    "ck_meta_step_text": lambda d, log: _rewrite(_ck(d), _set(step="two")),
    "ck_directory": lambda d, log: _ck_replace(d, lambda p: p.mkdir()),
    "ck_dangling": lambda d, log: _ck_replace(d, lambda p: p.symlink_to(d / "nowhere.npz")),
    "ck_pickle": lambda d, log: _pickled(_ck(d)),
    "ck_crc": lambda d, log: flip_in_array(_ck(d)),
    "ck_seed_7": lambda d, log: _rewrite(_ck(d), _set(fingerprint=_foreign(d, _seed_7))),
    "ck_wide_model": lambda d, log: _rewrite(_ck(d), _set(fingerprint=_foreign(d, _wide))),
    "ck_shape": lambda d, log: _rewrite(_ck(d), arrays_edit=_reshape_first),
    "ck_missing_stage": lambda d, log: _rewrite(_ck(d), arrays_edit=_drop("critic-train/")),
    "ck_no_fingerprint": lambda d, log: _rewrite(_ck(d), lambda m: m.pop("fingerprint")),
    "ck_fingerprint_edited": lambda d, log: _rewrite(_ck(d), _edit_fingerprint),
    "ck_other_log": lambda d, log: _rewrite(_ck(d), _set(log=str(d / "other.h5"))),
    "ck_no_log": lambda d, log: _rewrite(_ck(d), _set(log="")),
    "ck_misnamed": lambda d, log: _rewrite(_ck(d), _set(step=1)),
    "ck_bad_counter": lambda d, log: _rewrite(_ck(d), lambda m: m["counters"]["actor-train"][0]
                                              .update(updates=-1)),
    "ck_bad_plan": lambda d, log: _rewrite(_ck(d), _set(plan={"stages": "all of them"})),
    "older_torn": lambda d, log: _older_torn(d),
    "dump_torn": lambda d, log: _truncate(_dump_rank(d, 0)),
    "dump_seed_7": lambda d, log: [_rewrite(_dump_rank(d, r), _set(
        fingerprint=_foreign(d, _seed_7))) for r in (0, 1)],
    "dump_piece_missing": lambda d, log: _rewrite(_dump_rank(d, 0), _dump_piece_missing),
    "log_removed": lambda d, log: (d / "run.h5").unlink(),
    "log_seed_7": lambda d, log: ((d / "run.h5").unlink(), write_log(
        d / "run.h5", _other(job_of(_job())[2], _seed_7))),
    "log_no_fingerprint": lambda d, log: ((d / "run.h5").unlink(),
                                          write_log(d / "run.h5", None)),
    "log_text": lambda d, log: (d / "run.h5").write_text("not a log\n"),
    "log_truncated": lambda d, log: _truncate(d / "run.h5"),
    "log_directory": lambda d, log: ((d / "run.h5").unlink(), (d / "run.h5").mkdir()),
    "ckpt_file": lambda d, log: (d / "new.h5.ckpt").write_text("keep me\n"),
}
