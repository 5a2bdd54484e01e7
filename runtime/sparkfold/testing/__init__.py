"""Test fixtures shipped with the package, so users' tests and ours share them."""
