"""The job fingerprint: which job a checkpoint, a rank dump or a run log belongs to (pure).

A resumed run (``nereus run --resume``, a requeued Slurm job, ``runtime.failures.resume``)
continues only the state of the same job. :func:`job_fingerprint` is a digest of a canonical
form (sorted-key JSON) of the parts of the parsed config that define that state; every
checkpoint, rank dump and run-log segment records it with its parts, so that a mismatch is
reported by the part that differs (:meth:`Fingerprint.differences`).

The parts (to add one — a dataset, a Hugging Face checkpoint — add one entry to
:func:`job_parts`):

- ``algorithm``: the algorithm, sync/async mode, global batch, samples per prompt and
  minibatches — the update rule and the data position a step reaches;
- ``models``: every role's architecture (every field of its ModelSpec, hence every tensor's
  shape) and the bytes per value;
- ``cluster``: the hardware types (GPU name, vendor, label) and GPUs per node — not the node
  count, which a relaunch on the surviving nodes or ``--ranks`` may change;
- ``seed``: ``runtime.seed`` (initial weights, sampling, the sample order);
- ``data``: the identity of the prompts, given by the caller (the shell names the built-in
  task: :func:`nereus.rl.task.task_identity`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nereus.config.schema import Config

DIGEST_CHARS = 16  # hex characters of the SHA-256 digest kept (64 bits)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Fingerprint:
    """``digest`` over ``parts`` (part name → its canonical JSON text)."""

    digest: str
    parts: tuple[tuple[str, str], ...]

    @staticmethod
    def of(parts: Mapping[str, Any]) -> Fingerprint:
        canon = tuple(sorted((str(k), _canonical(v)) for k, v in parts.items()))
        text = _canonical([[k, v] for k, v in canon])
        return Fingerprint(hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS],
                           canon)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "parts": {k: json.loads(v) for k, v in self.parts}}

    @staticmethod
    def from_dict(d: Any) -> Fingerprint | None:
        """The fingerprint a file recorded (None: absent or malformed); its digest is computed
        again from the recorded parts, so a part edited by hand does not pass for the job."""
        if not isinstance(d, Mapping) or not isinstance(d.get("parts"), Mapping):
            return None
        try:
            fp = Fingerprint.of(d["parts"])
        except (TypeError, ValueError):
            return None
        return fp if d.get("digest") == fp.digest else None

    def differences(self, other: Fingerprint) -> str:
        """What differs in ``other`` (a recorded fingerprint) from this one (the config's):
        ``"seed 1 (this config: 0)"``; "" when they are equal."""
        mine, theirs = dict(self.parts), dict(other.parts)
        out = []
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name) == theirs.get(name):
                continue
            a = json.loads(mine[name]) if name in mine else None
            b = json.loads(theirs[name]) if name in theirs else None
            out.append(_first_difference(name, b, a))
        return "; ".join(out)

    def summary(self) -> str:
        """One short line: digest, algorithm, seed, models, data."""
        parts = {k: json.loads(v) for k, v in self.parts}
        algo = parts.get("algorithm") or {}
        models = parts.get("models") or {}
        names = ", ".join(f"{role} {m.get('name', '?')}" for role, m in sorted(models.items())
                          if isinstance(m, Mapping))
        data = parts.get("data") or {}
        source = data.get("source", "?") if isinstance(data, Mapping) else "?"
        return (f"{self.digest} ({algo.get('algorithm', '?')} {algo.get('mode', '?')}, seed "
                f"{parts.get('seed', '?')}, models {names or '?'}, data {source})")


def _first_difference(path: str, recorded: Any, mine: Any) -> str:
    """The first place two JSON values differ, as ``path recorded (this config: mine)``."""
    if isinstance(recorded, Mapping) and isinstance(mine, Mapping):
        for key in sorted(set(recorded) | set(mine)):
            if recorded.get(key) != mine.get(key):
                return _first_difference(f"{path}.{key}", recorded.get(key), mine.get(key))
    short = _canonical(recorded)[:80] if recorded is not None else "absent"
    own = _canonical(mine)[:80] if mine is not None else "absent"
    return f"{path} {short} (this config: {own})"


def job_parts(cfg: Config, seed: int, data: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of the fingerprint of the job ``cfg`` describes (see the module docstring)."""
    job, cluster = cfg.setup.job, cfg.setup.cluster
    return {
        "algorithm": {"algorithm": job.algorithm, "mode": job.mode,
                      "global_batch": job.global_batch, "minibatches": job.minibatches,
                      "samples_per_prompt": job.samples_per_prompt},
        "models": {role: {**asdict(spec), "dtype_bytes": job.dtype_bytes}
                   for role, spec in job.models},
        "cluster": {"gpus_per_node": cluster.gpus_per_node,
                    "hardware": sorted({(t.name, t.vendor, t.label) for t in cluster.types})},
        "seed": int(seed),
        "data": dict(data),
    }


def job_fingerprint(cfg: Config, seed: int, data: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of the job ``cfg`` describes, run with ``seed`` on the prompts ``data``
    identifies (plain JSON data)."""
    return Fingerprint.of(job_parts(cfg, seed, data))
