"""Export trained units as a Hugging Face checkpoint, from whatever plan the ranks hold
(effectful: collective over the job).

``runtime.save_hf`` (:mod:`nereus.config.save_hf`) asks for exports at step boundaries. Every
rank calls :func:`export_checkpoint` with its units; the first replica of each exported
model-stage (``actor-train``, ``critic-train``) writes, each rank from its own place
(:func:`nereus.emu.hf_export.export_plan`): a writer receives the tp pieces of the tensors it
was given over its stage's tp group, already in the source checkpoint's dtype and straight into
their rows, rearranges them into Hugging Face names and layout (:mod:`nereus.emu.hf_layout`)
and writes its files with ``safetensors.torch.save_file``. So no rank holds more than its shard
plus one file's tensors (``max_file_gb``) and the pieces it is receiving. Rank 0 writes ``model.safetensors.index.json``, ``config.json`` (the source's; a critic's
as a one-label ``*ForTokenClassification``), ``generation_config.json`` and copies the source's
tokenizer files.

Everything goes into a temporary folder beside the target, renamed to ``DIR/step-<k>`` once
every rank's files are on disk: an export is complete or absent, never over an existing path.
A failed export (a full disk) removes its temporary folder, is logged and the run goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nereus.config.checkpoint import ModelCheckpoint
from nereus.config.files import kind_of
from nereus.config.save_hf import SaveHfOptions
from nereus.emu.hf_export import ExportFile, export_plan, index_of
from nereus.emu.hf_layout import hf_config, hf_tensors
from nereus.emu.hf_slices import LM_HEAD, OUTPUT, SCORE
from nereus.emu.shards import shards_at, tensor_specs
from nereus.errors import ConfigError
from nereus.hf.tokenizer import TOKENIZER_FILES
from nereus.rl.tokens import SpecialTokens
from nereus.runtime.mpi import frames

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class RoleExport:
    """What one exported role is: its model-stage, its source checkpoint (None: a model built
    from random weights), the head it is written with and the dtype."""

    role: str
    model_stage: str
    source: ModelCheckpoint | None
    head: str
    dtype: torch.dtype


def check_export_dir(path: str, field: str = "runtime.save_hf.dir") -> None:
    """Before a fresh run: the export folder is absent (its parent a writable folder) or an
    empty writable folder — a run never writes into earlier exports (a resumed run continues
    its own)."""
    full = os.path.abspath(path)
    try:
        info = os.lstat(full)
    except FileNotFoundError:
        info = None
    except OSError as e:
        raise ConfigError(field, path, f"cannot be used ({e.strerror or e})") from None
    where = full
    if info is None:
        where = os.path.dirname(full)
        if not os.path.isdir(where):
            raise ConfigError(field, path, "its parent folder does not exist")
    elif not stat.S_ISDIR(info.st_mode):
        raise ConfigError(field, path, f"exists and is {kind_of(info.st_mode)}, not a folder")
    elif os.listdir(full):
        raise ConfigError(field, path, "exists and is not empty; exports are never written "
                          "over anything (pick a new folder, or --resume the run that made it)")
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(field, path, f"{where} is not writable")


def step_dir(opts: SaveHfOptions, steps_done: int) -> str:
    return os.path.join(os.path.abspath(opts.dir), f"step-{steps_done:06d}")


def role_exports(opts: SaveHfOptions, checkpoints: dict[str, ModelCheckpoint],
                 zero_stages: tuple[str, ...]) -> tuple[RoleExport, ...]:
    """The roles ``opts`` exports: the trainer's units (its synced copy where the trainer is
    a DeepSpeed ZeRO unit), each with its source and dtype."""
    out = []
    for role in opts.roles:
        stage = f"{role}-train"
        if stage in zero_stages:
            stage = "actor-gen" if role == "actor" else "critic-inf"
        ck = checkpoints.get(role)
        dtype = DTYPES.get(ck.dtype, torch.float32) if ck is not None else torch.float32
        out.append(RoleExport(role, stage, ck, LM_HEAD if role == "actor" else SCORE, dtype))
    return tuple(out)


def _slices(box: Any) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))


def _assemble(st: Any, name: str, local: torch.Tensor, writer_tp: int,
              dtype: torch.dtype) -> torch.Tensor | None:
    """The global logical tensor ``name`` of this rank's stage, in the export's ``dtype``, on
    the writer (tp rank ``writer_tp``), None on the other tp ranks: each tp rank sends its
    pieces (converted to ``dtype``) to the writer over the stage's tp group, which receives
    them straight into their rows of the tensor (a column block through a buffer)."""
    spec, layout = st.spec, st.emu.layout
    pp_rank, tp_rank = st.position
    t = next(x for x in tensor_specs(spec) if x.name == name)
    if t.kind == "replicated" or layout.tp == 1:
        return local.to("cpu", dtype=dtype) if tp_rank == writer_tp else None  # no copy if same
    group = st.groups.tp
    host = dist.get_backend(group) == "gloo"
    writer = st.emu.gpu_at(pp_rank, writer_tp)
    if tp_rank != writer_tp:
        for pc in next(s for s in shards_at(spec, layout, pp_rank, tp_rank)
                       if s.tensor == name).pieces:
            piece = local[_slices(pc.local)].to(dtype=dtype).contiguous()
            dist.send(piece.cpu() if host else piece, dst=writer, group=group)
        return None
    out = torch.empty(t.global_shape, dtype=dtype)
    for r in range(layout.tp):
        for pc in next(s for s in shards_at(spec, layout, pp_rank, r) if s.tensor == name).pieces:
            dst = out[_slices(pc.global_)]
            if r == tp_rank:
                dst.copy_(local[_slices(pc.local)])
                continue
            direct = dst.is_contiguous() and host
            buf = dst if direct else torch.empty(
                pc.global_.shape, dtype=dtype, device="cpu" if host else local.device)
            dist.recv(buf, src=st.emu.gpu_at(pp_rank, r), group=group)
            if not direct:
                dst.copy_(buf)
    return out


def _hf_of(st: Any, name: str, full: torch.Tensor, head: str) -> list[tuple[str, torch.Tensor]]:
    """The Hugging Face tensors of logical tensor ``name`` (``full``, in the export dtype).
    The layout change only moves values, so 16-bit tensors go through numpy as int16 views
    (numpy has no bfloat16): tensors that map one to one stay views of ``full``."""
    if name == OUTPUT and head != LM_HEAD:
        return [("score.weight", full[:1].clone()), ("score.bias", torch.zeros(1, dtype=full.dtype))]
    dtype = full.dtype
    raw = full.view(torch.int16) if full.element_size() == 2 else full
    return [(n, torch.from_numpy(np.ascontiguousarray(a)).view(dtype))
            for n, a in hf_tensors(st.spec, {name: raw.numpy()})]


def write_files(st: Any, files: tuple[ExportFile, ...], folder: str,
                re: RoleExport) -> tuple[int, str]:
    """This rank's part of one replica's export: the gathers it joins and the files it writes
    (collective over the unit's tp groups: a rank whose write fails still joins every
    gather); returns the bytes written and the first error."""
    from safetensors.torch import save_file

    pp_rank, tp_rank = st.position
    live = st.tensors()["param"]
    keys = {s.tensor: s.local_key for s in st.shards()}
    written, error = 0, ""
    for f in files:
        if f.pp_rank != pp_rank:
            continue
        tensors: dict[str, torch.Tensor] = {}
        for name in f.tensors:
            local = live[keys[name]].detach()
            if name == OUTPUT and re.head != LM_HEAD:  # row 0, on tp rank 0 (the plan's writer)
                full = (local[:1].to("cpu", dtype=re.dtype, copy=True)
                        if tp_rank == f.tp_rank else None)
            else:
                full = _assemble(st, name, local, f.tp_rank, re.dtype)
            if full is None:
                continue
            tensors.update(_hf_of(st, name, full, re.head))
            del full
        if f.tp_rank != tp_rank or error:
            continue
        path = os.path.join(folder, f.name)
        try:
            save_file(tensors, path, metadata={"format": "pt"})
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
            written += os.path.getsize(path)
        except OSError as e:
            error = f"{path}: {e.strerror or e}"
    return written, error


def _config(re: RoleExport, st_spec: Any, special: SpecialTokens) -> dict[str, Any]:
    if re.source is None:
        cfg = hf_config(st_spec, eos_token_id=list(special.eos_ids), pad_token_id=special.pad_id,
                        bos_token_id=special.bos_id, torch_dtype=DTYPE_NAMES[re.dtype])
    else:
        cfg = json.loads(json.dumps(dict(re.source.facts.config)))
    if re.head != LM_HEAD:  # a critic: per-token values, one label, untied trunk
        arch = str((cfg.get("architectures") or ["LlamaForCausalLM"])[0])
        family = arch.split("For")[0]
        cfg.update(architectures=[f"{family}ForTokenClassification"], num_labels=1,
                   id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
                   tie_word_embeddings=False)
    return cfg


def write_metadata(folder: str, re: RoleExport, spec: Any, files: tuple[ExportFile, ...],
                   special: SpecialTokens, tokenizer_dir: str | None) -> None:
    """Rank 0: index, config.json, generation_config.json and the tokenizer files."""
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as fh:
        json.dump(index_of(files), fh, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(_config(re, spec, special), fh, indent=2)
    copied = set()
    for source in (re.source.directory if re.source else None, tokenizer_dir):
        if not source:
            continue
        for name in TOKENIZER_FILES:
            src = os.path.join(source, name)
            if name not in copied and os.path.isfile(src):
                shutil.copyfile(src, os.path.join(folder, name))
                copied.add(name)
    if "generation_config.json" not in copied:
        with open(os.path.join(folder, "generation_config.json"), "w") as fh:
            json.dump({"eos_token_id": list(special.eos_ids), "pad_token_id": special.pad_id,
                       "bos_token_id": special.bos_id}, fh, indent=2)


def export_checkpoint(units: Any, comm: Any, is_root: bool, steps_done: int,
                      opts: SaveHfOptions, exports: tuple[RoleExport, ...],
                      special: SpecialTokens, tokenizer_dir: str | None,
                      tag: str) -> dict[str, Any]:
    """Every rank: export the roles of ``exports`` after ``steps_done`` steps into
    ``DIR/step-<k>`` (collective). Returns what happened (the same on every rank):
    ``{"path", "bytes", "skipped" | "error"}``."""
    final = step_dir(opts, steps_done)
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.tmp-{tag}")
    status: dict[str, Any] = {"path": final}
    if is_root:
        try:
            if os.path.lexists(final):
                status["skipped"] = "exists (written before a resume)"
            else:
                os.makedirs(os.path.dirname(final), exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
                for re in exports:
                    os.makedirs(os.path.join(tmp, re.role))
        except OSError as e:
            status["error"] = f"cannot create {tmp} ({e.strerror or e})"
    status = frames.bcast(comm, status, 0, "save-hf")
    if "skipped" in status or "error" in status:
        return status
    written, error = 0, ""
    plans = {}
    for re in exports:
        su = units.stages[re.model_stage]
        spec = units.setup.job.model(re.role)
        files = export_plan(spec, su.emus[0].layout,
                            torch.tensor([], dtype=re.dtype).element_size(),
                            max(1, int(opts.max_file_gb * 1e9)), re.head)
        plans[re.role] = (spec, files)
        st = su.mine.get(0)
        if st is None:
            continue
        n, err = write_files(st, files, os.path.join(tmp, re.role), re)
        written += n
        error = error or err
    got = frames.allgather(comm, {"bytes": written, "error": error}, "save-hf-done")
    errors = [g["error"] for g in got if g["error"]]
    total = sum(int(g["bytes"]) for g in got)
    if is_root:
        try:
            if errors:
                raise OSError(errors[0])
            for re in exports:
                spec, files = plans[re.role]
                write_metadata(os.path.join(tmp, re.role), re, spec, files, special,
                               tokenizer_dir)
            os.rename(tmp, final)
            fd = os.open(os.path.dirname(final), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            status = {"path": final, "bytes": total}
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            status = {"path": final, "error": str(e.strerror or e)}
    return dict(frames.bcast(comm, status, 0, "save-hf-end"))
