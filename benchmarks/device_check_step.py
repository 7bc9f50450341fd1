"""Part (c) of the device check: one training step of a unit on the device against a reference
computed another way (run by benchmarks/device_check.py in its own process; prints one JSON line).

    python3 benchmarks/device_check_step.py [--dry-run]

The unit: a Llama-family GPTModel (RoPE, RMSNorm, SwiGLU; Megatron-core, built by Nereus for the
rank's device: the GPU with TF32 off in the real run, the CPU in the dry run) takes one step of
the tests' training probe (tests/support/unit_training.py: next-token cross entropy over two
micro-batches, host labels, Adam). The reference: the same weights converted by
``nereus.emu.hf_layout.to_hf`` into Hugging Face ``transformers``' ``LlamaForCausalLM`` on the
CPU in fp32, the same loss over the whole batch at once, autograd, ``torch.optim.Adam``; its
gradients mapped back by ``from_hf``. Two implementations (Megatron's fused QKV and SwiGLU,
our pipeline schedule and micro-batches against transformers' separate projections, one batch),
so the dry run on the CPU can fail as the GPU run can.

Gated: the loss (relative ``LOSS_RTOL``), every gradient (``GRAD_RTOL``·max|g| + ``GRAD_ATOL``
per tensor), the Adam update where the gradient is resolved (|g| above 100× its tensor's bound,
so its sign and Adam's ±lr step are the same on both sides: within ``UPDATE_RTOL``·lr) and
everywhere within 2·lr, the labels placed on the logits' device (checked with logits on torch's
``meta`` device, which refuses a mismatch as CUDA does), and on the GPU a Destroyed unit's
memory given back. Reported: the step in bf16 (parameters bf16, fp32 masters) against the same
reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

# fp32 on both sides, TF32 off: the same arithmetic in another order (cuBLAS or the CPU BLAS,
# fused against separate projections, two micro-batches against one batch). A K-term fp32 dot
# product differs by at most ~K·2^-24 relative (K <= 256 here: 1.5e-5); a loss (a mean over
# tokens) far less. Gradients: |Δ| <= 1e-4·max|g| + 1e-7 per tensor; loss: relative 1e-5.
GRAD_RTOL, GRAD_ATOL, LOSS_RTOL = 1e-4, 1e-7, 1e-5
UPDATE_RTOL = 1e-3  # Adam's first step where |g| is resolved: lr·g/(|g|+eps), the same ±lr
LR = 1e-3
ROWS, SEQ, MICRO = 8, 32, 4


def _spec() -> Any:
    from support.hf_cases import TINY_LLAMA

    return TINY_LLAMA


def _batch(spec: Any) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    from support.hf_cases import global_weights

    rng = np.random.default_rng(5)
    tokens = torch.from_numpy(rng.integers(0, spec.vocab_size, (ROWS, SEQ + 1)))
    return global_weights(spec, 7), tokens


def labels_follow_logits() -> bool:
    """The probe's loss puts its labels on the logits' device (meta logits stand for CUDA)."""
    from support.unit_training import token_loss

    labels = torch.randint(0, 7, (2, 3))
    out = token_loss(labels, [0], 2)(0, torch.empty(2, 3, 7, device="meta"))
    return out.device.type == "meta"


def unit_step(spec: Any, weights: dict[str, np.ndarray], tokens: torch.Tensor, device: Any,
              groups: Any) -> dict[str, Any]:
    """One step of the probe on a unit built for ``device`` (a RankDevice)."""
    from support.unit_training import train_step

    from nereus.emu.unit import Emu, Layout
    from nereus.runtime.worker.state import load_global, new_unit_state

    emu = Emu("actor-train", "actor-train", Layout(1, 1), (0,))
    st = new_unit_state(spec, emu, 0, groups, lr=LR, device=device, initialize=False)
    zeros = {k: np.zeros_like(v) for k, v in weights.items()}
    load_global(st, {"param": weights, "exp_avg": zeros, "exp_avg_sq": zeros})
    grads: dict[str, np.ndarray] = {}

    def keep(p: Any, k: str) -> None:
        if p.grad is not None:  # under mixed precision the fp32 masters took it already
            grads[k] = p.grad.detach().float().cpu().numpy().copy()

    hooks = [p.register_post_accumulate_grad_hook(lambda p, k=k: keep(p, k))
             for k, p in st.model.named_parameters()]
    loss = train_step(st, tokens[:, :-1], tokens[:, 1:], micro_batch=MICRO)
    for h in hooks:
        h.remove()
    return {"loss": float(loss), "grads": grads, "param": st.snapshot()["param"]}


def reference_step(spec: Any, weights: dict[str, np.ndarray], tokens: torch.Tensor
                   ) -> dict[str, Any]:
    """The same step by transformers' LlamaForCausalLM on the CPU, fp32, one batch."""
    import torch.nn.functional as F
    import transformers

    from nereus.emu.hf_layout import from_hf, hf_config, to_hf

    cfg = hf_config(spec, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    kwargs = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                        "torch_dtype")}
    kwargs["pad_token_id"] = None  # no padding row (its embedding would get no gradient)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).float()
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in to_hf(spec, weights).items()}, strict=False)
    if list(missing) or list(unexpected):
        raise RuntimeError(f"reference weights: missing {missing}, unexpected {unexpected}")
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    logits = model(input_ids=tokens[:, :-1]).logits
    labels = tokens[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    loss.backward()
    named = dict(model.named_parameters())
    grads = from_hf(spec, {k: p.grad.detach().numpy().copy() for k, p in named.items()})
    opt.step()
    params = from_hf(spec, {k: p.detach().numpy().copy() for k, p in named.items()})
    return {"loss": float(loss.detach()), "grads": grads, "param": params}


def compare(ref: dict[str, Any], got: dict[str, Any], before: dict[str, np.ndarray]
            ) -> dict[str, Any]:
    """The gates of the module's docstring, with their worst figures."""
    out: dict[str, Any] = {"loss_reference": ref["loss"], "loss_device": got["loss"]}
    out["loss_rel_diff"] = abs(ref["loss"] - got["loss"]) / max(abs(ref["loss"]), 1e-12)
    worst_grad, worst_update, worst_any = 0.0, 0.0, 0.0
    same_keys = set(ref["grads"]) == set(got["grads"]) == set(before)
    grads_ok = same_keys
    for k in sorted(set(ref["grads"]) & set(got["grads"])):
        g_ref, g = ref["grads"][k], got["grads"][k]
        bound = GRAD_RTOL * float(np.max(np.abs(g_ref))) + GRAD_ATOL
        d = float(np.max(np.abs(g_ref - g)))
        worst_grad = max(worst_grad, d / bound)
        grads_ok &= d <= bound
        up_ref = ref["param"][k] - before[k]
        up = got["param"][k] - before[k]
        resolved = np.abs(g_ref) > 100 * bound
        if resolved.any():
            worst_update = max(worst_update, float(np.max(np.abs(up_ref - up)[resolved])) / LR)
        worst_any = max(worst_any, float(np.max(np.abs(up_ref - up))) / LR)
    out["same_tensors"] = same_keys
    out["grad_worst_share_of_tolerance"] = round(worst_grad, 4)
    out["update_worst_resolved_share_of_lr"] = worst_update
    out["update_worst_share_of_lr"] = worst_any
    out["ok"] = (out["loss_rel_diff"] <= LOSS_RTOL and grads_ok
                 and worst_update <= UPDATE_RTOL and worst_any <= 2.0 + 1e-3)
    return out


def main(dry_run: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from nereus.cluster.devices import DeviceChoice, cpu_choice
    from nereus.cluster.transport import RankPlacement
    from nereus.engines.megatron_model import StageGroups, prepare_device
    from nereus.runtime.execution.device import RankDevice

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    store = dist.HashStore()  # one process: nothing listens
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    solo = dist.new_group([0], backend="gloo")
    groups = StageGroups(solo, solo, solo, solo, solo)
    gpu = not dry_run and torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(0)
        prepare_device(0)
        choice = DeviceChoice("cuda", "nvidia", 0, "nvidia:0", False, "device check")
    else:
        choice = cpu_choice("device check dry run")
    placements = (RankPlacement(0, "local", choice.kind, choice.vendor,
                                choice.device_id if gpu else ""),)
    spec = _spec()
    weights, tokens = _batch(spec)
    ref = reference_step(spec, weights, tokens)
    got = unit_step(spec, weights, tokens, RankDevice(choice, placements, 0,
                                                      dtype=torch.float32), groups)
    res: dict[str, Any] = {"device": "cuda" if gpu else "cpu", "tf32": False,
                           "reference": "transformers LlamaForCausalLM, CPU fp32",
                           "model": spec.name, "tolerance": {
                               "loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL,
                               "grad_atol": GRAD_ATOL, "update_rtol_of_lr": UPDATE_RTOL}}
    res.update(compare(ref, got, weights))
    res["labels_follow_logits"] = labels_follow_logits()
    res["ok"] = res["ok"] and res["labels_follow_logits"]
    if gpu:  # the run's precision: bf16 parameters, fp32 masters (reported, not gated)
        bf = unit_step(spec, weights, tokens, RankDevice(choice, placements, 0,
                                                         dtype=torch.bfloat16), groups)
        res["loss_bf16_device"] = bf["loss"]
        res["loss_bf16_rel_diff"] = abs(ref["loss"] - bf["loss"]) / max(abs(ref["loss"]), 1e-12)
        res["memory_returned"] = destroy_returns_memory(spec, groups, choice, placements, store)
        res["ok"] = res["ok"] and res["memory_returned"]["ok"]
    else:
        res["memory_returned"] = {"ok": True, "skipped": "no device"}
    return res


def destroy_returns_memory(spec: Any, groups: Any, choice: Any, placements: Any,
                           store: Any) -> dict[str, Any]:
    """A Destroy through the executor gives the unit's memory back to the device."""
    from nereus.emu.primitives import Destroy
    from nereus.emu.unit import Emu, Layout
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import new_unit_state

    dev = RankDevice(choice, placements, 0)
    ex = TorchExecutor(spec, 0, store, "check", device=dev)
    unit = Emu("actor-train", "actor-train", Layout(1, 1), (0,))
    twin = Emu("actor-train", "actor-train", Layout(1, 1), (1,))  # the replica that stays
    torch.cuda.synchronize()
    base_reserved = torch.cuda.memory_reserved()
    ex.units[unit] = new_unit_state(spec, unit, 0, groups, device=dev, initialize=False)
    held = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    ex.destroy(Destroy(unit, 0), live={unit, twin})
    after_alloc, after_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    return {"allocated_before": held, "allocated_after": after_alloc,
            "reserved_before": reserved, "reserved_after": after_reserved,
            "ok": after_alloc < held and after_reserved <= max(base_reserved, reserved) and
            after_reserved < reserved}


if __name__ == "__main__":
    print(json.dumps(main("--dry-run" in sys.argv[1:]), default=float))
