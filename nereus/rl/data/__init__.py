"""A job's prompts: the tokenizer, the prompt files and the data's identity."""
