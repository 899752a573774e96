"""The two shapes of a cloud resource that the adapters (`rlops.cloud`) and the provisioning engine
(`rlops.provision`) exchange, in rlops's own flat field vocabulary: what the spec wants (`Resource`)
and what the cloud has (`Live`). Below both, so neither imports the other for them."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    kind: str
    name: str
    desired: dict
    depends_on: tuple[str, ...] = ()
    # Created by its parent's create call (the cluster's system pool): no call of its own then.
    created_with: str | None = None
    labels: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Live:
    """A resource as it is now, in the same flat vocabulary as `Resource.desired`."""

    fields: dict
    owned: bool
    depends_on: tuple[str, ...] = ()
    # Still being created by an earlier, interrupted apply: an operation to wait on before using it.
    settling: object = field(default=None, compare=False)
