"""Hugging Face checkpoints and tokenizers in the runtime (effectful): a checkpoint read by
slices into each rank's shard (:mod:`nereus.hf.load`), its tokenizer's EOS and PAD ids and text
codec (:mod:`nereus.hf.tokenizer`), and the export of trained units as a checkpoint transformers
loads (:mod:`nereus.hf.export`). The pure parts: :mod:`nereus.config.hf_config` (config.json),
:mod:`nereus.emu.hf_layout` and :mod:`nereus.emu.hf_slices` (names, slices, export plan)."""
