"""What runs on a node: rank supervision, peer watch, sd_notify."""
