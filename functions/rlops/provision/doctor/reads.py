"""What every check of the doctor shares: a finding, and the reads the checks share (each made once)."""

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from google.cloud import compute_v1, storage

from rlops.cloud.base import CloudError, Connection, call, get_or_none
from rlops.permissions import Need
from rlops.provision.service import CloudEnvironment
from rlops.spec.model import GcpEnvironment


@dataclass(frozen=True)
class Finding:
    check: str
    verdict: str   # ok, warn or fail
    found: str
    fix: str = ""


class Reads:
    """What the checks read: the connection and the state bucket, and the API reads they share, each made once
    however many checks ask for it, and all of one check's at once (`all`)."""

    def __init__(self, connection: Connection, bucket: storage.Bucket, pool: ThreadPoolExecutor,
                 needs: tuple[Need, ...]):
        self.connection, self.bucket, self._pool = connection, bucket, pool
        self.needs = needs
        self._started: dict[str, Future] = {}
        self._lock = threading.Lock()

    def start(self, key: str, api: str, read: Callable[[], Any], missing_ok: bool = False) -> Future:
        """The read of `key`, started now or by an earlier ask; with `missing_ok`, None where it does not exist."""
        with self._lock:
            if key not in self._started:
                what = f"read {key}"
                fetch = (lambda: get_or_none(api, what, read)) if missing_ok else (lambda: call(api, what, read))
                self._started[key] = self._pool.submit(fetch)
            return self._started[key]

    def all(self, wanted: dict[str, tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
        """{key: (api, read)} -> {key: its answer}, read in parallel; the first failure raises."""
        futures = {key: self.start(key, api, read) for key, (api, read) in wanted.items()}
        return {key: future.result() for key, future in futures.items()}

    def compute(self, client: type, method: str, **where: str) -> tuple[str, Callable[[], Any]]:
        return "compute", lambda: getattr(self.connection.gapic("compute", client), method)(**where)

    def listed(self, spec: GcpEnvironment, kind: str) -> tuple[str, tuple[str, Callable[[], Any]]]:
        """The project's networks, firewalls or global addresses, or the region's subnetworks: (key, read), one
        list shared by the checks that ask (quotas, the PSA range)."""
        if kind == "subnetwork":
            return f"subnetworks of {spec.region}", self.compute(compute_v1.SubnetworksClient, "list",
                                                                 project=spec.project.id, region=spec.region)
        client = {"network": compute_v1.NetworksClient, "firewall": compute_v1.FirewallsClient,
                  "address": compute_v1.GlobalAddressesClient}[kind]
        return f"{kind}s of {spec.project.id}", self.compute(client, "list", project=spec.project.id)


Check = Callable[[CloudEnvironment, Reads], list[Finding]]


def guarded(check: Check, env: CloudEnvironment, reads: Reads) -> list[Finding]:
    try:
        return check(env, reads)
    except CloudError as error:
        name = check.__name__.strip("_").replace("_", "-")
        return [Finding(name, "fail", f"could not check: {error}", "see the error; `rlops doctor` again")]
