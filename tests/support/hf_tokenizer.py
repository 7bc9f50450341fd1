"""A small Hugging Face tokenizer made here: a byte-level BPE trained with ``tokenizers`` on a few
sentences, saved by transformers' ``PreTrainedTokenizerFast`` with a Qwen-style chat template
(``<|im_start|>role ... <|im_end|>``), EOS ``<|im_end|>`` and PAD ``<|endoftext|>`` — the kind of
folder a checkpoint ships."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "How many clips did Natalia sell altogether in April and May? #### 72",
    "Weng earns $12 an hour for babysitting. Yesterday, she did 50 minutes of babysitting.",
    "The answer is \\boxed{\\frac{1}{2}}. What is 3/4 of 1,200? Compute -5 + 2.",
] * 20


def write_tokenizer(folder: Path, chat_template: bool = True, generation_eos: list[int] | None
                    = None) -> Path:
    """A tokenizer folder at ``folder`` (made); with ``generation_eos`` also a
    generation_config.json naming those EOS ids (as a checkpoint folder has)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    if generation_eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id":
                                                                   generation_eos}))
    return folder
