"""What rlops's calls need from Google's IAM, and which predefined roles grant it.

Each adapter declares, on the function that makes a call, the REST methods it calls (`calls`), by the ids
Google's discovery documents give them; the permissions they need and the roles that grant them are Google's
own tables (spec/gcp_iam, vendored from iann0036/iam-dataset with its commit in SOURCE.json), never
written here. What a method's table cannot say (acting as a service account, the Kubernetes API through GKE's
IAM) is declared as permissions (`requires`). `provision/accounts.py` says which code each service account
runs; `rlops iam` prints the result.
"""

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path

DATA = Path(__file__).parent / "spec" / "gcp_iam"


class Scope(str, Enum):
    """Where a permission is granted: the project, or the one resource it is used on (least privilege)."""

    PROJECT = "project"
    SECRET = "secret"                    # each token secret and rlops-github-token
    GITHUB_TOKEN = "rlops-github-token"  # that secret alone (Cloud Build hands it to the plan pipeline)
    BUCKET = "bucket"                    # the state bucket
    NODE_SERVICE_ACCOUNT = "node service account"
    EVENTS_TOPIC = "rlops-events topic"
    FUNCTION_ACCOUNTS = "the functions' service accounts"


@dataclass(frozen=True, order=True)
class Need:
    permission: str
    scope: Scope = Scope.PROJECT


@cache
def method_permissions() -> dict[str, tuple[str, ...]]:
    """REST method id -> the permissions Google checks. The table also lists, for reads and writes of objects,
    the IAM-policy permissions a call needs only when it reads or sets ACLs, which rlops never asks for: left
    out (kept for the IAM-policy methods themselves)."""
    table = json.loads((DATA / "methods.json").read_text())
    return {method: tuple(p for p in permissions if method.endswith("IamPolicy") or not p.endswith("IamPolicy"))
            for method, permissions in table.items()}


@dataclass(frozen=True)
class Role:
    name: str
    title: str
    stage: str                 # GA, BETA, ...
    size: int                  # how many permissions it grants in all
    writes: int                # how many of them change something: what "smallest" minimises first
    permissions: frozenset     # those of them rlops could need


@cache
def roles() -> dict[str, Role]:
    table = json.loads((DATA / "roles.json").read_text())
    return {name: Role(name, role["title"], role["stage"], role["permission_count"], role["write_count"],
                       frozenset(role["permissions"])) for name, role in table.items()}


def _cost(role: Role) -> tuple[int, int]:
    """Fewest permissions that change something, then fewest in all: a read-only role beats a smaller writer."""
    return role.writes, role.size


def _scope_of(method: str) -> Scope:
    if method.startswith("storage."):
        return Scope.BUCKET
    if method.startswith("secretmanager.") and ".versions." in method:
        return Scope.SECRET
    return Scope.PROJECT


def needs_of_methods(methods: Iterable[str]) -> tuple[Need, ...]:
    table = method_permissions()
    unknown = [m for m in methods if m not in table]
    if unknown:
        raise KeyError(f"no IAM data for {', '.join(unknown)} (spec/gcp_iam/methods.json)")
    return tuple(Need(p, _scope_of(m)) for m in methods for p in table[m])


def calls(*methods: str, also: tuple[Need, ...] = ()) -> Callable:
    """Declares that the decorated function calls these REST methods (and needs `also` besides). A `{name}` in a
    method id is filled from that attribute of the class the function is read through (compute's kinds share
    their code)."""
    def declare(function: Callable) -> Callable:
        function.rlops_calls = (methods, also)
        return function
    return declare


def requires(*needs: Need) -> Callable:
    return calls(also=needs)


def declared(*things: type | Callable | tuple[type, str]) -> tuple[Need, ...]:
    """The needs declared by these functions, by (class, method name) pairs, and by these classes: on the class
    itself (an adapter whose every method shares a few calls, as the state bucket's) and on each of its functions
    (their own and inherited)."""
    found: list[Need] = []
    for thing in things:
        if isinstance(thing, tuple):  # (class, method name): one method, read through that class
            functions = [(getattr(thing[0], thing[1]), thing[0])]
        elif isinstance(thing, type):
            members = {name: value for klass in reversed(thing.__mro__) for name, value in vars(klass).items()}
            functions = [(value, thing) for value in [thing, *members.values()] if hasattr(value, "rlops_calls")]
        else:
            functions = [(thing, None)]
        for function, owner in functions:
            methods, also = function.rlops_calls
            found += needs_of_methods([re.sub(r"\{(\w+)\}", lambda m, owner=owner: getattr(owner, m[1]), method)
                                       for method in methods]) + tuple(also)
    return tuple(sorted(set(found)))


def smallest_roles(permissions: Iterable[str]) -> list[str]:
    """The generally available predefined roles that together grant `permissions` and, of all such sets, grant
    the fewest permissions that change something, then the fewest in all (an exact search: a few dozen
    permissions, each granted by a few dozen roles at most)."""
    wanted = frozenset(permissions)
    candidates = [r for r in roles().values() if r.stage == "GA" and r.permissions & wanted]
    ungrantable = wanted - {p for role in candidates for p in role.permissions}
    if ungrantable:
        raise KeyError(f"no predefined role grants {', '.join(sorted(ungrantable))}")
    granting = {p: sorted(_granting(p, candidates), key=_cost) for p in wanted}
    best: tuple[tuple[int, int], list[str]] = ((10**9, 10**9), [])

    def search(missing: frozenset, chosen: list[Role], cost: tuple[int, int]) -> None:
        nonlocal best
        if cost >= best[0]:
            return
        if not missing:
            best = (cost, sorted(r.name for r in chosen))
            return
        hardest = min(missing, key=lambda p: len(granting[p]))  # fewest ways to grant it: the narrowest branch
        for role in granting[hardest]:
            writes, size = _cost(role)
            search(missing - role.permissions, chosen + [role], (cost[0] + writes, cost[1] + size))

    search(wanted, [], (0, 0))
    return best[1]


def _granting(permission: str, candidates: list[Role]) -> list[Role]:
    """The roles of the permission's own service that grant it (roles/container.* for container.*), else any: a
    cross-service role (iam.securityReviewer) grants far more than anyone means to give an account."""
    every = [r for r in candidates if permission in r.permissions]
    own = [r for r in every if r.name.removeprefix("roles/").split(".")[0] == permission.split(".")[0]]
    return own or every


def roles_granting(permission: str, most: int = 3) -> list[str]:
    """The smallest generally available predefined roles that grant `permission`, smallest first."""
    candidates = _granting(permission, [r for r in roles().values() if r.stage == "GA"])
    return [r.name for r in sorted(candidates, key=lambda r: (_cost(r), r.name))[:most]]


def said_with_roles(permission: str) -> str:
    """"P (in roles/A, roles/B or roles/C)": the roles that grant it, for an error or a finding to name."""
    granting = roles_granting(permission)
    named = ", ".join(granting[:-1]) + f" or {granting[-1]}" if len(granting) > 1 else "".join(granting)
    return f"{permission} (in {named or 'no predefined role'})"


# How a refusal names the permission: Google's APIs, Cloud Storage, Compute's older wording, GKE's IAM
# authorizer on the Kubernetes API ("requires one of ["container.pods.list"] permission(s)").
_PERMISSION_SAID = re.compile(r"Permission '([a-z]+(?:\.[A-Za-z]+)+)' denied|does not have ([a-z]+(?:\.[A-Za-z]+)+) "
                             r"access|Required '([a-z]+(?:\.[A-Za-z]+)+)' permission|requires one of "
                             r"\[\"([a-z]+(?:\.[A-Za-z]+)+)\"")


def denied_permission(error: Exception | str) -> str | None:
    """The permission a 403 names: its google.rpc.ErrorInfo's metadata (Google's APIs), else its message (Cloud
    Storage says it only there)."""
    if isinstance(error, str):
        error = Exception(error)
    for detail in getattr(error, "details", None) or ():
        metadata = detail.get("metadata") if isinstance(detail, dict) else getattr(detail, "metadata", None)
        if metadata and metadata.get("permission"):
            return metadata["permission"]
    found = _PERMISSION_SAID.search(getattr(error, "message", None) or str(error))
    return next((group for group in found.groups() if group), None) if found else None


def lacking_permission(error: Exception | str) -> str | None:
    """What a refused call (or an operation's error message) lacks and the roles that have it, when the refusal
    names the permission."""
    permission = denied_permission(error)
    return (f"the caller lacks {said_with_roles(permission)}; `rlops iam` lists each account's roles"
            if permission else None)
