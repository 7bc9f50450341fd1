"""Write a small Hugging Face checkpoint with random weights and a locally trained tokenizer.

``python -m nereus.tools.tiny_checkpoint DIR [--family qwen2] [--layers 2] [--hidden 64] ...``
writes what a user brings to Nereus, made here with no download: ``config.json``, sharded
safetensors with their index (transformers' ``save_pretrained``), ``generation_config.json``
with its EOS ids, and a byte-level BPE tokenizer trained in a second with ``tokenizers`` on a
small built-in corpus and saved by transformers with a ChatML chat template (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``). Families: ``llama`` (optionally with Llama
3.1's RoPE scaling), ``qwen2`` (q/k/v bias), ``qwen3`` (q/k norm), ``mistral``; heads: a causal
LM, or ``--head score`` for a one-label ``*ForSequenceClassification`` (a reward model).

Random weights are drawn from ``--seed`` and scaled (``--scale``: the matrices' standard
deviation; norms 1 ± 0.2, biases ± 0.1) so that logits are of order one and every tensor
matters to them: a wrong mapping of any tensor shows in the logits. Special tokens (Qwen's):
``<|endoftext|>`` (PAD, and an EOS), ``<|im_start|>``, ``<|im_end|>`` (the first EOS). The
tokenizer's vocabulary fits in the model's (``--vocab``, default 320).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
HEADS = ("lm", "score")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = (
    "abc:abcabcabc", "de:dededede", "aab:aabaabaab", "Question: what is 2 + 3? Answer: 5",
    "The quick brown fox jumps over the lazy dog.", "#### 42", "\\boxed{7}",
    "Let us think step by step.", "user", "assistant", "system", "You are a helpful assistant.",
)


@dataclass(frozen=True)
class TinyModel:
    """The architecture and files of a tiny checkpoint."""

    family: str = "qwen2"
    layers: int = 2
    hidden: int = 64
    ffn: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 0  # 0: hidden / heads
    vocab: int = 320
    max_positions: int = 512
    tie: bool = False
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # e.g. Llama 3.1's llama3 parameters
    norm_eps: float = 1e-6
    head: str = "lm"  # lm | score
    dtype: str = "float32"  # float32 | bfloat16 | float16
    seed: int = 0
    scale: float = 0.16
    shard_bytes: int = 0  # >0: safetensors files of at most this many bytes (sharded, indexed)
    sliding_window: int = 0  # mistral only; 0: none


LLAMA31_SCALING = (("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
                   ("high_freq_factor", 4.0), ("original_max_position_embeddings", 64))


def hf_config(m: TinyModel) -> Any:
    """The transformers config object of ``m``."""
    import transformers

    kw: dict[str, Any] = dict(
        vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.ffn,
        num_hidden_layers=m.layers, num_attention_heads=m.heads, num_key_value_heads=m.kv_heads,
        max_position_embeddings=m.max_positions, rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie, rope_theta=m.rope_theta, bos_token_id=None,
        eos_token_id=[2, 0], pad_token_id=0)
    if m.rope_scaling:
        kw["rope_scaling"] = {**dict(m.rope_scaling), "rope_theta": m.rope_theta}
    if m.head_dim or m.family == "qwen3":
        kw["head_dim"] = m.head_dim or m.hidden // m.heads
    if m.family == "mistral":
        kw["sliding_window"] = m.sliding_window or None
    if m.head == "score":
        kw["num_labels"] = 1
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}
    return classes[m.family](**kw)


def model_class(m: TinyModel) -> Any:
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}[m.family]
    return getattr(transformers, name + ("ForCausalLM" if m.head == "lm"
                                         else "ForSequenceClassification"))


def random_model(m: TinyModel) -> Any:
    """The transformers model of ``m`` with scaled random weights (fp32)."""
    import torch

    model = model_class(m)(hf_config(m))
    gen = torch.Generator().manual_seed(m.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(m.scale * noise)
    return model.eval()


def train_tokenizer(vocab: int) -> Any:
    """A byte-level BPE (``tokenizers``) trained on :data:`CORPUS`, as a transformers fast
    tokenizer with Qwen's special tokens and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(CORPUS) * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write(directory: str, m: TinyModel = TinyModel()) -> str:
    """Write the checkpoint of ``m`` into the new folder ``directory`` (refused if it exists);
    returns its path."""
    import torch
    from transformers import GenerationConfig

    if os.path.exists(directory):
        raise FileExistsError(f"{directory} exists; give a new folder")
    tok = train_tokenizer(m.vocab)
    if len(tok) > m.vocab:
        raise ValueError(f"the tokenizer has {len(tok)} tokens, more than vocab={m.vocab}")
    model = random_model(m)
    model = model.to(getattr(torch, m.dtype))
    kwargs: dict[str, Any] = {}
    if m.shard_bytes:
        kwargs["max_shard_size"] = m.shard_bytes
    model.save_pretrained(directory, **kwargs)
    tok.save_pretrained(directory)
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=tok.pad_token_id,
                     bos_token_id=None).save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nereus.tools.tiny_checkpoint",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("directory")
    p.add_argument("--family", choices=FAMILIES, default="qwen2")
    p.add_argument("--head", choices=HEADS, default="lm")
    for flag, default in (("layers", 2), ("hidden", 64), ("ffn", 128), ("heads", 4),
                          ("kv-heads", 2), ("head-dim", 0), ("vocab", 320),
                          ("max-positions", 512), ("seed", 0), ("shard-bytes", 0)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--tie", action="store_true", help="tie the input and output embeddings")
    p.add_argument("--llama31-scaling", action="store_true",
                   help="Llama 3.1's RoPE scaling (llama family)")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    args = p.parse_args(argv)
    m = TinyModel(family=args.family, layers=args.layers, hidden=args.hidden, ffn=args.ffn,
                  heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                  vocab=args.vocab, max_positions=args.max_positions, tie=args.tie,
                  rope_theta=args.rope_theta, head=args.head, dtype=args.dtype, seed=args.seed,
                  shard_bytes=args.shard_bytes,
                  rope_scaling=LLAMA31_SCALING if args.llama31_scaling else ())
    try:
        write(args.directory, m)
    except (FileExistsError, ValueError) as e:
        print(f"nereus.tools.tiny_checkpoint: {e}", file=sys.stderr)
        return 2
    print(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
