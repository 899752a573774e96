"""rlops: a GitOps control plane for GRPO post-training on GKE (and on one machine)."""

__version__ = "0.1.0"
