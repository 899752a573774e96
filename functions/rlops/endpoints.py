"""Where rlops's clients point: Google's APIs and GitHub, or local emulators and fakes.

Read once from the process's environment where a process starts (the CLI's `main`, a Cloud
Function's handler), then passed down to every client: nothing writes `os.environ` at run time.
A local environment's emulators are added with `with_emulators` once its stack says where they are.
"""

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

GITHUB_API = "https://api.github.com"


@dataclass(frozen=True)
class Endpoints:
    # api -> URL, e.g. {"compute": "http://127.0.0.1:8080"}: a fake GCP control plane (RLOPS_API_ENDPOINTS)
    apis: Mapping[str, str] = field(default_factory=dict)
    storage: str | None = None   # fake-gcs-server's URL (STORAGE_EMULATOR_HOST)
    pubsub: str | None = None    # Google's Pub/Sub emulator, HOST:PORT (PUBSUB_EMULATOR_HOST)
    kube: str | None = None      # an API server at a URL, not through GKE's DNS endpoint (RLOPS_KUBE_API)
    github: str = GITHUB_API     # RLOPS_GITHUB_API
    # GOOGLE_APPLICATION_CREDENTIALS: with fakes, whose credentials to send (a fake that enforces IAM knows its
    # callers by them); unset, a fake is called anonymously. Google's APIs always get the default credentials.
    credentials: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> "Endpoints":
        return cls(apis=json.loads(environ.get("RLOPS_API_ENDPOINTS") or "{}"),
                   storage=environ.get("STORAGE_EMULATOR_HOST") or None,
                   pubsub=environ.get("PUBSUB_EMULATOR_HOST") or None,
                   kube=environ.get("RLOPS_KUBE_API") or None,
                   github=(environ.get("RLOPS_GITHUB_API") or GITHUB_API).rstrip("/"),
                   credentials=environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None)

    def with_emulators(self, storage: str | None, pubsub: str | None) -> "Endpoints":
        return replace(self, storage=storage or self.storage, pubsub=pubsub or self.pubsub)
