"""Generation with a KV cache on Megatron-core's static inference path (CPU or GPU, effectful).

Megatron-core 0.16.1's static inference (``StaticInferenceContext``) runs on CPU with two
per-instance changes to a built GPTModel (no parameters change, so EMU state transfer is
unaffected): every self-attention's ``_allocate_memory`` allocates the KV cache where the model
is (Megatron's own takes the current CUDA device), and on the CPU the core attention
(:class:`~nereus.engines.megatron_model.SdpaAttention`) handles a query shorter than the keys
(decode) with a bottom-right aligned causal mask; on a GPU it is Megatron's stock attention.
Inputs move to the model's device, the results come back to the host. Prefill returns only the last position's logits; each decode step feeds one token.

Sampling is inverse-CDF with uniforms drawn per *global sample index* (not per replica), so the
same seed gives the same tokens under any DP/TP layout up to floating-point reduction order.
This is the CPU engine behind :class:`nereus.engines.backend.GenerationEngine`; on GPU clusters
``runtime.generation: vllm`` serves the same interface with vLLM (:mod:`nereus.engines.vllm_engine`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nereus.engines.masks import attention_mask, decode_mask, positions_of
from nereus.engines.pipeline import StageLink, forward_cached, from_last
from nereus.engines.vocab import GatherLastDim
from nereus.rl.task import EOS, PAD


def _allocate_kv_memory(self: Any, n: int, b: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The KV cache where the attention's weights are (Megatron's own takes the current CUDA
    device)."""
    device = next(self.parameters()).device
    return torch.empty(n, b, self.num_query_groups_per_partition, dim, dtype=dtype,
                       device=device)


def _gathering_output_forward(orig: Any, tp_group: dist.ProcessGroup) -> Any:
    """The output layer's forward, gathering the vocab shards with our CPU all-gather
    (Megatron's gather allocates its buffer on CUDA)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_gather_output"] = False
        local, bias = orig(*args, **kwargs)
        return GatherLastDim.apply(local, tp_group), bias

    return forward


def enable_kv_cache(model: torch.nn.Module, tp_group: dist.ProcessGroup) -> None:
    """Patch ``model``'s instances for CPU KV-cache inference (call once per model)."""
    if getattr(model, "_nereus_kv_ready", False):
        return
    model._nereus_kv_ready = True  # type: ignore[assignment]
    out_layer: Any = getattr(model, "output_layer", None)  # absent on non-last pp stages
    if out_layer is not None:
        out_layer.forward = _gathering_output_forward(out_layer.forward, tp_group)
    for layer in model.decoder.layers:  # type: ignore[union-attr]
        attn = layer.self_attention
        attn._allocate_memory = types.MethodType(_allocate_kv_memory, attn)
        # The core attention (SdpaAttention) already handles decode queries against the cache.


@dataclass(frozen=True)
class Generated:
    """``tokens`` [b, P+T] (prompt then response, PAD after EOS), ``logp`` [b, T] sampling
    log-probs of the response tokens, ``mask`` [b, T] 1 on response tokens (EOS included),
    ``kv_cache_bytes`` the bytes the KV cache held."""

    tokens: torch.Tensor
    logp: torch.Tensor
    mask: torch.Tensor
    kv_cache_bytes: int


def sample_uniforms(seed: int, step: int, sample_ids: np.ndarray, max_new: int) -> torch.Tensor:
    """[b, max_new] uniforms of the global samples ``sample_ids`` at ``step`` (layout-free)."""
    rows = [np.random.Generator(np.random.PCG64([seed, step, int(i), 7])).random(max_new)
            for i in sample_ids]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros(0, max_new,
                                                                     dtype=torch.float64)


def _pick(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
    logp_all = torch.log_softmax(logits.double() / temperature, dim=-1)
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    cdf = torch.cumsum(logp_all.exp(), dim=-1).contiguous()
    tok = torch.searchsorted(cdf, u.double().reshape(-1, 1).contiguous()).squeeze(-1).clamp_max(
        logits.shape[-1] - 1)
    return tok, logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def _choose(logits: torch.Tensor | None, u: torch.Tensor, temperature: float, greedy: bool,
            link: StageLink | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, log-prob) per row, picked on the last pipeline stage and broadcast to the others."""
    picked = None
    if logits is not None:
        if greedy:
            tok = logits.argmax(dim=-1)
            lp = torch.log_softmax(logits.double() / temperature, -1).gather(
                -1, tok.unsqueeze(-1)).squeeze(-1)
        else:
            tok, lp = _pick(logits, u, temperature)
        picked = torch.stack([tok.double(), lp], dim=1)
    if link is not None:
        picked = from_last(link, picked, torch.empty(u.shape[0], 2, dtype=torch.float64,
                                                      device=u.device))
    if picked is None:
        raise ValueError("no logits on a single-stage unit")
    return picked[:, 0].long(), picked[:, 1]


def generate(model: torch.nn.Module, tp_group: dist.ProcessGroup, prompts: torch.Tensor,
             uniforms: torch.Tensor, max_new: int, temperature: float = 1.0,
             greedy: bool = False, link: StageLink | None = None,
             prompt_valid: torch.Tensor | None = None, eos_ids: tuple[int, ...] = (EOS,),
             pad_id: int = PAD) -> Generated:
    """Sample up to ``max_new`` tokens after ``prompts`` [b, P] with a KV cache.

    ``prompt_valid`` [b, P] (True on real tokens) masks a left-padded batch's padding out of
    every attention (:mod:`nereus.engines.masks`): each row samples what it samples alone.
    A row stops at the first of ``eos_ids`` it samples (kept, mask 1); after it come
    ``pad_id`` tokens (mask 0).

    Every rank of the unit calls this with the same inputs (Megatron gathers the vocab-parallel
    logits over the unit's tp group, ``tp_group`` is that group). With ``link`` (pp > 1) every
    prefill and decode step runs through the pipeline stages (each caches its own layers), the
    last stage picks the tokens and broadcasts them over the pp group, so every stage returns
    the same result. Stops early when every sequence has stopped."""
    from megatron.core.inference.contexts import StaticInferenceContext

    if link is not None and link.pp == 1:
        link = None
    dev = next(model.parameters()).device  # inputs go to the model; results come back to host
    prompts, uniforms = prompts.to(dev), uniforms.to(dev)
    b, p_len = prompts.shape
    valid = None if prompt_valid is None or bool(prompt_valid.all()) else prompt_valid.to(
        dev).bool()
    keys = valid  # [b, keys so far] validity of the cached keys
    real = p_len if valid is None else valid.sum(dim=1, keepdim=True)  # real prompt tokens
    stops = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=dev)
    ctx = StaticInferenceContext(max(b, 1), p_len + max_new)
    out = torch.full((b, max_new), pad_id, dtype=torch.long, device=dev)
    logp = torch.zeros(b, max_new, dtype=torch.float64, device=dev)
    mask = torch.zeros(b, max_new, dtype=torch.float64, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)

    def last_logits(tokens: torch.Tensor, positions: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor | None:
        if link is None:
            local: torch.Tensor = model(tokens, positions, mask, inference_context=ctx,
                                        runtime_gather_output=True)
        else:
            got = forward_cached(model, link, tokens, positions, ctx, mask)
            if got is None:
                return None
            local = got
        return local[:, -1, :]  # gathered over tp by Megatron

    model.eval()
    with torch.no_grad():
        logits = last_logits(prompts, positions_of(valid, b, p_len, dev), attention_mask(valid))
        ctx.sequence_len_offset += p_len
        for t in range(max_new):
            tok, lp = _choose(logits, uniforms[:, t], temperature, greedy, link)
            live = ~done
            out[:, t] = torch.where(live, tok, torch.full_like(tok, pad_id))
            logp[:, t] = torch.where(live, lp, torch.zeros_like(lp))
            mask[:, t] = live.double()
            done = done | torch.isin(tok, stops)
            if bool(done.all()) or t == max_new - 1:
                break
            pos = (torch.zeros(b, 1, dtype=torch.long, device=dev) + real + t).long()
            if keys is not None:
                keys = torch.cat([keys, torch.ones(b, 1, dtype=torch.bool, device=dev)], dim=1)
            logits = last_logits(out[:, t:t + 1], pos, decode_mask(keys))
            ctx.sequence_len_offset += 1
    kv_bytes = 0
    for mem in ctx.key_value_memory_dict.values():
        kv_bytes += sum(int(m.numel() * m.element_size()) for m in mem
                        if isinstance(m, torch.Tensor))
    model.train()
    return Generated(torch.cat([prompts, out], dim=1).cpu(), logp.cpu(), mask.cpu(), kv_bytes)
