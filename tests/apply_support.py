"""What the state bucket says of an apply: shared by the apply tests and the reviewed apply tests."""

from rlops.cli import common
from rlops.endpoints import Endpoints
from rlops.state.resources import AppliedSpec


def applied(name: str) -> bool:
    """Whether the state bucket says the environment's current spec was applied completely."""
    _, env = common.load_gcp(name)
    record = AppliedSpec(common.bucket(env, Endpoints.from_environment()), env.spec.state.prefix, env.name)
    return (record.read() or {}).get("spec_sha256") == env.digest
