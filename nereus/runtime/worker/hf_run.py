"""The Hugging Face side of ``nereus run`` on one rank (effectful): where each model's initial
state comes from, the text codec of the run, the load report and the exports.

- Initial state: a role whose model is a checkpoint (``models.<role>.checkpoint``) gets a
  :class:`nereus.hf.load.CheckpointSource` (each rank reads its own shard of its units); the
  others keep the random draw of a tp=1 model (:func:`nereus.runtime.worker.units.
  initial_global`).
- Codec: the actor checkpoint's tokenizer (EOS, PAD, text) when the actor is a checkpoint, else
  the task's own vocabulary (:mod:`nereus.rl.tokens`). The tokens reach every model as they
  are, so the critic and reward checkpoints must embed the actor tokenizer's ids.
- Load report: every rank's bytes read and seconds per role, logged by rank 0 as a
  ``checkpoint-load`` event.
- Exports: ``runtime.save_hf`` (:mod:`nereus.hf.export`) at the due boundaries and when the run
  is preempted, each logged as a ``save-hf`` event.
"""

from __future__ import annotations

from typing import Any

from nereus.config.checkpoint import ModelCheckpoint
from nereus.errors import ConfigError
from nereus.rl.tokens import TaskCodec, TextCodec
from nereus.runtime.mpi import frames


def preflight(cfg: Any, rc: Any, setup: Any, fresh: bool) -> None:
    """``nereus run`` before any rank starts: the actor's tokenizer against every model's
    vocabulary, and (a fresh run) the export folder absent or empty (one line, exit 2)."""
    if cfg.checkpoints:
        HfRun(cfg, rc, setup)
    if rc.save_hf.enabled and fresh:
        from nereus.hf.export import check_export_dir

        check_export_dir(rc.save_hf.dir)


class HfRun:
    """Built on every rank from the agreed config (its errors are the config's: one line)."""

    def __init__(self, cfg: Any, rc: Any, setup: Any) -> None:
        self.rc, self.setup = rc, setup
        self.checkpoints: dict[str, ModelCheckpoint] = dict(cfg.checkpoints)
        self.sources: dict[str, Any] = {}
        self.codec: TextCodec = TaskCodec()
        self.tokenizer_dir: str | None = None
        actor = self.checkpoints.get("actor")
        if actor is not None:
            from nereus.hf.tokenizer import load_codec

            self.codec = load_codec(actor)
            self.tokenizer_dir = actor.directory
        for role, spec in setup.job.models:  # every model embeds the actor's token ids
            if spec.vocab_size < self.codec.vocab_size:
                ck = self.checkpoints.get(role)
                raise ConfigError(f"models.{role}" + (".checkpoint" if ck else ""),
                                  ck.directory if ck else spec.name,
                                  f"vocab_size={spec.vocab_size} cannot embed the actor "
                                  f"tokenizer's {self.codec.vocab_size} ids")

    def initial_states(self, solo: Any) -> dict[str, Any]:
        """model-stage → its initial state: a checkpoint source or a drawn global state."""
        from nereus.hf.load import CheckpointSource
        from nereus.runtime.worker.units import initial_global

        setup, seed = self.setup, self.rc.seed
        seeds = {"actor": seed, "reference": seed, "critic": seed + 1, "reward": seed + 2}
        out: dict[str, Any] = {}
        for ms in setup.job.workflow.model_stages:
            ck = self.checkpoints.get(ms.role)
            if ck is not None:
                if ms.role not in self.sources:
                    self.sources[ms.role] = CheckpointSource(ck, seeds[ms.role])
                out[ms.name] = self.sources[ms.role]
                continue
            spec = setup.job.model(ms.role)
            same_as_actor = ms.role == "reference" and spec == setup.job.model("actor")
            out[ms.name] = initial_global(spec, seeds["actor" if same_as_actor else ms.role],
                                          solo)
        return out

    def report_load(self, comm: Any, rank: int, recorder: Any) -> None:
        """Every rank: its bytes read per role, gathered; rank 0 logs them (collective)."""
        if not self.checkpoints:
            return
        mine = {role: [s.stats.bytes_read, s.stats.seconds, s.stats.slices]
                for role, s in self.sources.items()}
        got = frames.allgather(comm, {"rank": rank, "read": mine}, "checkpoint-load")
        if recorder is None:
            return
        roles: dict[str, Any] = {}
        for g in got:
            for role, (nbytes, secs, slices) in g["read"].items():
                r = roles.setdefault(role, {"dir": self.checkpoints[role].directory,
                                            "bytes_read": {}, "seconds": {}, "slices": {}})
                r["bytes_read"][str(g["rank"])] = int(nbytes)
                r["seconds"][str(g["rank"])] = float(secs)
                r["slices"][str(g["rank"])] = int(slices)
        recorder.event(0, "checkpoint-load", roles)

    def export(self, units: Any, comm: Any, is_root: bool, steps_done: int, recorder: Any,
               tag: str) -> dict[str, Any] | None:
        """``runtime.save_hf`` after ``steps_done`` steps when due (collective); the outcome,
        logged by rank 0, or None."""
        opts = self.rc.save_hf
        if not opts.enabled or steps_done <= 0:
            return None
        from nereus.hf.export import export_checkpoint, role_exports

        exports = role_exports(opts, self.checkpoints, self.rc.zero_stages)
        got = export_checkpoint(units, comm, is_root, steps_done, opts, exports,
                                self.codec.special, self.tokenizer_dir, tag)
        if recorder is not None:
            recorder.event(max(steps_done - 1, 0), "save-hf", {**got, "step": steps_done})
            if "error" in got:
                recorder.say(f"  save_hf: the export after step {steps_done} failed: "
                             f"{got['error']} (the run goes on)")
            elif "skipped" not in got:
                recorder.say(f"  save_hf: {got['path']} ({got.get('bytes', 0) / 1e6:.1f} MB)")
        return got
