"""``sparkfold eval URL``: quality checks against any OpenAI-compatible endpoint."""
