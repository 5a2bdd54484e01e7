"""The Anthropic Messages dialect: a translator onto the one chat pipeline."""
