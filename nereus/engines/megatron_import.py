"""Import Megatron-core once per process, without two import-time costs Nereus never uses
(effectful).

* ``megatron.core.jit`` binds ``jit_fuser = torch.compile`` and some twenty fused helpers
  (bias-GeLU/GeGLU/SwiGLU, bias-dropout, fused cross entropy, L2 norm, MoE routing, the output
  gate) are decorated with it at import, which imports TorchDynamo and Inductor. Nereus builds
  its models with those fusions off (:func:`nereus.engines.megatron_model.transformer_config`),
  so the decorated helpers are not on its path; the import runs with a pass-through decorator
  in place of ``torch.compile``, which leaves ``jit_fuser`` as Megatron's own
  ``megatron.core.jit.disable_jit_fuser()`` would (a helper that is called anyway runs eagerly:
  the same arithmetic, no compilation). ``torch.compile`` itself is restored before this
  returns. (torch.optim still imports Dynamo on its first optimizer; measured on this CPU VM,
  a rank's imports — Megatron-core, an Adam optimizer, the tokenizer — went from 12.6 to 8.8 s
  of CPU with the hiding below.)
* Megatron-core's dynamic inference context and timers import wandb when it is installed
  (about a second, and two temporary folders left behind per process), and its timers torch's
  TensorBoard writer (about half a second); Nereus uses neither part, so both are hidden while
  Megatron-core imports (``import`` raises ImportError, which Megatron-core catches), unless
  imported already. Nereus's own sinks (:mod:`nereus.log.sinks`) import them normally
  afterwards.

Every Nereus module that imports Megatron-core at module level imports this module first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# optional imports of Megatron-core that Nereus never uses (see above)
HIDDEN = ("wandb", "torch.utils.tensorboard")


def _pass_through(model: Any = None, **_options: Any) -> Any:
    """``torch.compile``'s two call forms, compiling nothing: ``compile(fn)`` gives ``fn``,
    ``compile(**options)`` a decorator that gives its function back."""
    if model is None:
        return lambda fn: fn
    return model


@contextmanager
def _megatron_import_scope() -> Iterator[None]:
    import torch

    real_compile: Callable[..., Any] = torch.compile
    hidden = [name for name in HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # "import name" -> ImportError
    torch.compile = _pass_through
    try:
        yield
    finally:
        torch.compile = real_compile
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def load() -> None:
    """Import ``megatron.core`` (its package import loads the modules the builders use); a no-op
    once it is imported."""
    if "megatron.core" in sys.modules:
        return
    with _megatron_import_scope():
        import megatron.core  # noqa: F401


load()
