"""Checkpoints: which are complete (NeMo RL and TRL layouts), their manifests, and verifying them."""
