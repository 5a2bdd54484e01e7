"""The OpenAI Responses dialect: run as a chat completion, kept in a bounded in-memory store."""
