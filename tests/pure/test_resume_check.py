"""The job fingerprint and the checks a resumed run makes of its checkpoint folder (files made
as ``nereus run`` writes them, tests/support/resume_files.py; the whole command's refusals are
the bad-input corpus's ``resume-*`` cases)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from support.bad_inputs import CORPUS
from support.resume_files import flip_in_array, job_of, write_checkpoint, write_dump

from nereus.config.fingerprint import Fingerprint, job_fingerprint
from nereus.config.load import parse_yaml
from nereus.config.schema import parse_config
from nereus.rl.task import task_identity
from nereus.runtime.failures.checkpoint import latest_global, load_global
from nereus.runtime.failures.relaunch import segment_log
from nereus.runtime.failures.resume_check import (
    Expected,
    Unusable,
    belongs_to,
    check_checkpoint,
    expected_for,
    select,
)

JOB = CORPUS / "resume_job.yaml"
RAW = yaml.safe_load(JOB.read_text())


def _fp(raw: dict, seed: int = 0) -> Fingerprint:
    return job_fingerprint(parse_config(raw), seed, task_identity(seed))


def _edited(**changes: object) -> dict:
    raw = yaml.safe_load(JOB.read_text())
    for dotted, value in changes.items():
        node = raw
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value
    return raw


# ---- the fingerprint ---------------------------------------------------------------------

def test_the_fingerprint_is_a_digest_of_the_job_defining_parts() -> None:
    base = _fp(RAW)
    assert base == _fp(yaml.safe_load(JOB.read_text()))  # deterministic
    assert len(base.digest) == 16 and dict(base.parts).keys() == {
        "algorithm", "models", "cluster", "seed", "data"}
    changed = {
        "seed": _fp(RAW, seed=1),
        "mode": _fp(_edited(job__mode="async")),
        "global batch": _fp(_edited(job__global_batch=8)),
        "model shape": _fp(_edited(models__actor={**RAW["models"]["actor"], "hidden_size": 32})),
        "hardware": _fp(_edited(cluster__gpu="h200")),
        "GPUs per node": _fp(_edited(cluster__gpus_per_node=4)),
    }
    for what, fp in changed.items():
        assert fp.digest != base.digest, what
    # what a resume may change: the node count (a relaunch on the survivors), the steps, the
    # learning rate, the controller
    same = [_edited(cluster__nodes=3), _edited(runtime__steps=9), _edited(runtime__lr=0.5),
            _edited(controller={"gamma": 0.0})]
    assert all(_fp(raw) == base for raw in same)


def test_a_difference_is_named_by_its_part_and_an_edited_part_is_refused() -> None:
    base = _fp(RAW)
    wide = _fp(_edited(models__critic={**RAW["models"]["critic"], "num_layers": 2}))
    assert base.differences(wide) == "models.critic.num_layers 2 (this config: 1)"
    assert base.differences(base) == ""
    assert Fingerprint.from_dict(base.to_dict()) == base
    edited = base.to_dict()
    edited["parts"]["seed"] = 5
    assert Fingerprint.from_dict(edited) is None  # the digest no longer matches its parts
    assert Fingerprint.from_dict({"digest": base.digest}) is None
    assert Fingerprint.from_dict("x") is None
    assert "ppo sync, seed 0, models actor micro" in base.summary()


# ---- the choice in a checkpoint folder -----------------------------------------------------

def _expect(log: Path) -> Expected:
    _, setup, fp = job_of(JOB)
    return expected_for(setup, fp, str(log))


def test_the_newest_usable_checkpoint_is_taken_and_the_unusable_newer_ones_named(
        tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    folder = tmp_path / "run.h5.ckpt"
    for step in (1, 2, 3):
        write_checkpoint(folder, JOB, log, step)
    sel = select(str(folder), _expect(log))
    assert sel.choice is not None and sel.choice.step == 3 and sel.skipped == ()
    newest = folder / "step-00000003.npz"
    newest.write_bytes(newest.read_bytes()[:1000])  # torn
    (folder / "step-00000002.npz").write_text("text\n")
    (folder / "step-00000009.npz.part.npz").write_bytes(b"half")  # an unfinished write: not one
    sel = select(str(folder), _expect(log))
    assert sel.choice is not None and sel.choice.step == 1
    assert [Path(p).name for p, _ in sel.skipped] == ["step-00000003.npz", "step-00000002.npz"]
    assert all("is not a complete .npz archive" in why for _, why in sel.skipped)
    assert "skipped" in sel.warnings()[0] and "step-00000003.npz" in sel.warnings()[0]
    # the ranks (and a rank-death recovery) load the same one
    found = latest_global(str(folder), _expect(log))
    assert found is not None and found[1] == 1
    assert float(found[2]["actor-train"]["param"]["embedding.word_embeddings.weight"][0, 0]) == 1.0


def test_a_dump_newer_than_every_checkpoint_is_taken_and_a_torn_one_is_passed_over(
        tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    folder = tmp_path / "ckpt"
    write_checkpoint(folder, JOB, log, 1)
    files = write_dump(folder, JOB, log, 2)
    sel = select(str(folder), _expect(log))
    assert sel.choice is not None and sel.choice.dump is not None and sel.choice.step == 2
    assert sel.choice.log == str(log)
    files[0].write_bytes(files[0].read_bytes()[:200])  # rank 0 (every replica) torn
    sel = select(str(folder), _expect(log))
    assert sel.choice is not None and sel.choice.dump is None and sel.choice.step == 1
    assert [p for p, _ in sel.skipped] == [str(files[0])]


def test_a_foreign_or_other_logs_checkpoint_is_not_taken(tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    folder = tmp_path / "ckpt"
    write_checkpoint(folder, JOB, log, 1)
    write_checkpoint(folder, JOB, log, 2, fingerprint=_fp(RAW, seed=3))
    sel = select(str(folder), _expect(log))
    assert sel.choice is not None and sel.choice.step == 1
    assert "was written by another job (data.seed 3 (this config: 0); seed 3" in sel.skipped[0][1]
    assert select(str(folder), _expect(tmp_path / "other.h5")).choice is None
    # no expectation: the files' structure only (the launcher's own messages, a relaunch)
    assert select(str(folder), Expected()).choice.step == 2  # type: ignore[union-attr]


def test_a_checkpoint_of_a_relaunch_segment_continues_the_first_log(tmp_path: Path) -> None:
    first = str(tmp_path / "run.h5")
    assert belongs_to(segment_log(first, 3), first)
    assert belongs_to(first, first)
    assert not belongs_to(str(tmp_path / "run.relaunch-x.h5"), first)
    assert not belongs_to(str(tmp_path / "other.h5"), first)
    assert not belongs_to("", first)


def test_a_member_damaged_after_the_check_fails_its_load_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    path = write_checkpoint(tmp_path, JOB, log, 1)
    flip_in_array(path)
    check_checkpoint(str(path), _expect(log), crc=False)  # headers and metadata still read
    with pytest.raises(Unusable, match="is damaged"):
        load_global(str(path))
    with pytest.raises(Unusable, match="fails its CRC check"):
        check_checkpoint(str(path), _expect(log), crc=True)


def test_the_state_arrays_must_have_the_configs_shapes(tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    path = write_checkpoint(tmp_path, JOB, log, 1)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    key = next(k for k in arrays if k.startswith("critic-inf/exp_avg/"))
    arrays[key] = arrays[key].astype(np.int32)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(Unusable, match=f"has {key} of dtype int32, not floating point"):
        check_checkpoint(str(path), _expect(log))


# ---- YAML depth, whatever PyYAML's parser does ---------------------------------------------

def test_the_composer_bounds_the_depth_when_the_event_pass_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML 6.0.4's libyaml stops at its own 1,000 levels with a syntax error before it yields
    the deep events; whatever the event pass misses, the composer refuses the 33rd level before
    it recurses into it (the real versions: tests/ranks/test_yaml_versions.py)."""
    from nereus.errors import ConfigError

    monkeypatch.setattr("nereus.config.load._check_shape", lambda text, source: None)
    deep = "job: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(ConfigError, match=r"nests deeper than 32 levels \(MAX_YAML_DEPTH\)"):
        parse_yaml(deep)
    ok = "a: " + "[" * 31 + "1" + "]" * 31 + "\n"  # 32 levels with the top mapping: allowed
    assert parse_yaml(ok)["a"] is not None
    with pytest.raises(ConfigError, match="MAX_YAML_DEPTH"):
        parse_yaml("a: " + "[" * 32 + "1" + "]" * 32 + "\n")


# ---- the fingerprint in the log, shown by nereus report ------------------------------------

def test_nereus_report_shows_each_segments_fingerprint(tmp_path: Path) -> None:
    from support.resume_files import write_log

    from nereus.log.reader import read_run_log
    from nereus.log.summary import format_summary, summarize
    from nereus.log.writer import RunLogWriter

    base = _fp(RAW)
    path = write_log(tmp_path / "run.h5", base)
    with RunLogWriter.append_to(path, {"resumed": True, "fingerprint": base.to_dict()}) as w:
        w.log_step(2, step_s=1.0)
    s = summarize(read_run_log(path))
    assert [f["digest"] for f in s["fingerprints"]] == [base.digest, base.digest]
    assert "fingerprint" not in s["run_meta"]
    text = format_summary(s)
    assert f"job fingerprint: {base.digest} (ppo sync, seed 0, models actor micro" in text
    assert "(every one of 2 segment(s))" in text
    other = _fp(RAW, seed=4)
    with RunLogWriter.append_to(path, {"resumed": True, "fingerprint": other.to_dict()}) as w:
        w.log_step(3, step_s=1.0)
    text = format_summary(summarize(read_run_log(path)))
    assert "job fingerprints DIFFER across segments" in text and other.digest in text
    plain = tmp_path / "plain.h5"  # a log nereus run did not write (simulate, older runs)
    with RunLogWriter(plain, {"command": "test"}, {}) as w:
        w.log_step(0, step_s=1.0)
    assert "fingerprint" not in format_summary(summarize(read_run_log(plain)))
