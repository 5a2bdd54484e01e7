"""What runs on a node: preflight checks, fabric discovery, rank supervision, peer watch, sd_notify."""
