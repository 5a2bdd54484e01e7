"""One module per ``sparkfold`` command; each exposes ``command`` (a click command or group)."""
