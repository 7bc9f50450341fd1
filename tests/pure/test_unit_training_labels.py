"""The tests' training probe (tests/support/unit_training.py) puts each micro-batch's labels on
the device of its logits: a unit on a GPU computes logits there while the caller's labels are
host tensors (3f4bc70 kept them on the CPU, which raises on CUDA). Logits on torch's ``meta``
device stand for the GPU: a mismatch raises there as on CUDA, and no GPU is needed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from support.unit_training import token_loss


def test_labels_follow_the_logits_device() -> None:
    labels = torch.randint(0, 11, (4, 6))
    loss_of = token_loss(labels, [0, 2], 2)
    logits = torch.randn(2, 6, 11, device="meta")
    assert loss_of(1, logits).device.type == "meta"
    try:  # the mismatch the probe used to make: the meta device does refuse it
        F.cross_entropy(logits.reshape(-1, 11), labels[2:4].reshape(-1))
    except RuntimeError as e:
        assert "device" in str(e)
    else:
        raise AssertionError("cross entropy accepted labels on another device than the logits")


def test_loss_is_the_token_mean_over_the_whole_batch() -> None:
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 11, (4, 6), generator=gen)
    logits = torch.randn(4, 6, 11, generator=gen)
    loss_of = token_loss(labels, [0, 2], 2)
    total = loss_of(0, logits[0:2]) + loss_of(1, logits[2:4])
    want = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1))
    assert torch.allclose(total, want, rtol=1e-6, atol=0)
