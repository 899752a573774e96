"""A reviewed plan kept in a file (`rlops plan ENV --out FILE`) and applied as it is (`rlops apply ENV --plan FILE`):
Terraform's `plan -out` and `apply PLANFILE`. The file holds what the plan would do, the spec it was made from and
the live state it read (the cloud resources' fields and the cluster objects' changes); applying it is refused,
saying what moved, when the spec or the live state is no longer what was reviewed. No I/O: the caller reads and
writes the file."""

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from rlops.errors import Failure
from rlops.kube.diff import differences
from rlops.kube.objects import ObjectChange
from rlops.resource_shapes import Live
from rlops.spec.model import GcpEnvironment

FORMAT = "rlops-plan/1"


class Environment(Protocol):
    """A GCP environment's spec with its name: `service.CloudEnvironment`, which this module may not import (the
    service imports it)."""

    name: str
    spec: GcpEnvironment


def _plain(value: Any) -> Any:
    """`value` as JSON gives it back (tuples as lists), so that a state read now compares with one from a file."""
    return json.loads(json.dumps(value, sort_keys=True))


def live_state(live: dict[str, Live]) -> dict:
    """What a plan read of the cloud: every resource's fields and whether rlops owns it."""
    return _plain({key: {"fields": state.fields, "owned": state.owned} for key, state in sorted(live.items())})


def fingerprint(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _at(document: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(document, dict):
            return None
        document = document.get(part)
    return document


@dataclass(frozen=True)
class SavedPlan:
    environment: str
    created_at: str
    spec: dict                  # the spec's meaning (CloudEnvironment.digest hashes the same)
    live: dict                  # live_state()
    cluster_objects: list[dict]  # ObjectChange.summary() each: never an object's values
    plan: dict                  # the plan as `plan --format json` gives it
    text: str                   # the plan as the reviewer read it

    @classmethod
    def of(cls, env: Environment, plan_json: dict, live: dict[str, Live], cluster_objects: list[ObjectChange],
           text: str) -> "SavedPlan":
        return cls(env.name, datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
                   _plain(env.spec.model_dump(mode="json")), live_state(live),
                   _plain([change.summary() for change in cluster_objects]), plan_json, text)

    @property
    def fingerprints(self) -> dict:
        return {"spec_sha256": fingerprint(self.spec), "live_sha256": fingerprint(self.live),
                "cluster_objects_sha256": fingerprint(self.cluster_objects)}

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self), **self.fingerprints}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> "SavedPlan":
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise Failure(f"{where}: not a saved plan (line {error.lineno}: {error.msg}); make one with "
                          "`rlops plan ENV --out FILE`") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise Failure(f"{where}: not a saved plan of this rlops (format {FORMAT!r} expected); make one with "
                          "`rlops plan ENV --out FILE`")
        try:
            saved = cls(**{name: document[name] for name in cls.__dataclass_fields__})
        except KeyError as missing:
            raise Failure(f"{where}: the saved plan has no {missing.args[0]!r}; make it again") from None
        if {k: document.get(k) for k in saved.fingerprints} != saved.fingerprints:
            raise Failure(f"{where}: the saved plan was edited after it was made (its fingerprints do not match "
                          "what it holds); make it again")
        return saved

    def moved(self, env: Environment, live: dict[str, Live], cluster_objects: list[ObjectChange]) -> list[str]:
        """What is no longer as this plan found it: the environment, its spec, its cloud resources, its cluster's
        objects. Empty: the plan is what an apply would do now."""
        if env.name != self.environment:
            return [f"the plan is for environment {self.environment}, not {env.name}"]
        found = []
        spec = _plain(env.spec.model_dump(mode="json"))
        for path in differences(spec, self.spec):
            found.append(f"the spec's {path}: {_short(_at(self.spec, path))} when planned, {_short(_at(spec, path))} "
                         "now")
        now = live_state(live)
        for key in sorted(set(now) | set(self.live)):
            was, is_ = self.live.get(key), now.get(key)
            if was == is_:
                continue
            if was is None:
                found.append(f"{key} appeared since the plan")
            elif is_ is None:
                found.append(f"{key} is gone since the plan")
            else:
                fields = [f"{name} {_short(was['fields'].get(name))} -> {_short(is_['fields'].get(name))}"
                          for name in sorted(set(was["fields"]) | set(is_["fields"]))
                          if was["fields"].get(name) != is_["fields"].get(name)]
                if was["owned"] != is_["owned"]:
                    fields.append("now managed by rlops" if is_["owned"] else "no longer managed by rlops")
                found.append(f"{key}: {', '.join(fields)}")
        objects = _plain([change.summary() for change in cluster_objects])
        if objects != self.cluster_objects:
            line = lambda c: f"{c['action']} {c['kind']}/{c['namespace'] + '/' if c['namespace'] else ''}{c['name']}"  # noqa: E731
            planned, now_lines = {line(c) for c in self.cluster_objects}, {line(c) for c in objects}
            detail = [f"planned, no longer: {x}" for x in sorted(planned - now_lines)] + \
                [f"new: {x}" for x in sorted(now_lines - planned)]
            found.append("the cluster's objects moved" + (f" ({'; '.join(detail)})" if detail else
                                                           " (the same objects, other fields)"))
        return found
