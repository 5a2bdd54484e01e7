"""The OpenAI dialect: chat completions, completions, models, tokenizer routes."""
