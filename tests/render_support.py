"""Seed specs edited for the in-cluster objects' tests, and the CRDs' validators: shared by the render tests, the GPU
transports' tests and the cluster sync tests."""

from functools import cache
from pathlib import Path

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# KubeRay's RayCluster CRD, verbatim, and GKE's multi-networking CRDs, v1, plus RDMA (see schemas/SOURCES.txt).
CRDS = {"RayCluster": "ray.io_rayclusters.yaml", "GKENetworkParamSet": "networking.gke.io_v1.yaml",
        "Network": "networking.gke.io_v1.yaml"}


@cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    """The validator of a custom resource's schema, read and checked once per process: the pure-Python YAML
    loader took 8 s over KubeRay's CRD, and `jsonschema.validate` checks the schema against its metaschema on
    every call (5 s for that CRD)."""
    content = yaml.load((SCHEMAS / CRDS[kind]).read_text(), Loader=yaml.CSafeLoader)
    if kind == "RayCluster":
        schema = next(v for v in content["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    else:
        schema = content[kind]
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def in_namespace_ray(specs, account_too: bool = True):
    """The h200 seed with `ray.namespace: ray` (and its service account there too, unless not `account_too`)."""
    spec = specs / "h200.yaml"
    text = spec.read_text().replace("  cluster_name: ray-cluster\n", "  cluster_name: ray-cluster\n  namespace: ray\n")
    if account_too:
        text = text.replace("    name: generic-ksa\n    namespace: default\n",
                            "    name: generic-ksa\n    namespace: ray\n")
    spec.write_text(text)
    return spec
