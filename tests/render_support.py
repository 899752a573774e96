"""Seed specs edited for the in-cluster objects' tests: shared by the render tests and the cluster sync tests."""


def in_namespace_ray(specs, account_too: bool = True):
    """The h200 seed with `ray.namespace: ray` (and its service account there too, unless not `account_too`)."""
    spec = specs / "h200.yaml"
    text = spec.read_text().replace("  cluster_name: ray-cluster\n", "  cluster_name: ray-cluster\n  namespace: ray\n")
    if account_too:
        text = text.replace("    name: generic-ksa\n    namespace: default\n",
                            "    name: generic-ksa\n    namespace: ray\n")
    spec.write_text(text)
    return spec
