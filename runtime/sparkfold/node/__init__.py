"""What runs on a node: preflight checks, fabric discovery, peer watch, sd_notify."""
