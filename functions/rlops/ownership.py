"""How rlops marks what it owns, so that it changes and deletes only that: the labels it puts on
cluster objects and GKE/Lustre resources (Compute resources, which have no labels, carry the same
words in their description: cloud/base.py)."""

MANAGED_BY = "rlops"


def labels_for(env_name: str) -> dict[str, str]:
    return {"rlops-env": env_name, "rlops-managed-by": MANAGED_BY}
