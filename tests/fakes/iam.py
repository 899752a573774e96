"""Google's IAM as the fakes enforce it: who calls (an OAuth access token the fake minted), which roles they
hold where (the project, a secret, a bucket, a service account; a resource inherits its project's bindings,
cloud.google.com/iam/docs/resource-hierarchy-access-control), and which permissions a role grants and a method
needs (Google's own tables, vendored in functions/rlops/spec/gcp_iam from iann0036/iam-dataset: see SOURCE.json).

A request without a token the fake minted is refused 401 UNAUTHENTICATED; one whose principal lacks a permission
403 PERMISSION_DENIED, in the shape Google's front ends use: the message names the permission and the resource,
`details` holds a google.rpc.ErrorInfo with reason IAM_PERMISSION_DENIED and the permission in its metadata
(cloud.google.com/apis/design/errors, "Error details"; what the Google client libraries parse into
`GoogleAPICallError.details`).

Tokens come from the fake's OAuth endpoint (`/token`): a test writes a service account key file whose
`token_uri` is that endpoint (`credentials_file`) and points GOOGLE_APPLICATION_CREDENTIALS at it, so the real
google-auth library signs its JWT, trades it for a token and sends that, as it does with Google.
"""

import itertools
import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from rlops.permissions import method_permissions, roles  # noqa: F401 - fakes.gcp and fakes.gcs_iam read it from here

TOKEN_SECONDS = 3600


def role_permissions() -> dict[str, frozenset[str]]:
    """role -> the permissions it grants (of those rlops could need: the vendored slice)."""
    return {name: role.permissions for name, role in roles().items()}


class Denied(Exception):
    def __init__(self, code: int, status: str, message: str, details: list[dict]):
        super().__init__(message)
        self.code, self.status, self.message, self.details = code, status, message, details


@dataclass(frozen=True)
class Principal:
    member: str  # "serviceAccount:rlops-apply@P.iam.gserviceaccount.com"

    @property
    def email(self) -> str:
        return self.member.split(":", 1)[1]


def service_account(name: str, project: str) -> str:
    return f"serviceAccount:{name}@{project}.iam.gserviceaccount.com"


class Iam:
    """The project's IAM policies and the tokens the fake's OAuth endpoint minted."""

    def __init__(self, project: str):
        self.project = project
        self._bindings: dict[str, dict[str, set[str]]] = {}   # resource -> member -> roles
        self._tokens: dict[str, str] = {}                     # access token -> member
        self._keys: dict[str, str] = {}                       # service account email -> its key's public PEM
        self._lock = threading.Lock()
        self._serial = itertools.count(1)
        self.checked: list[tuple[str, str, str]] = []        # (member, permission, resource), as asked

    # -- policies -----------------------------------------------------------------------------
    def grant(self, member: str, role: str, on: str | None = None) -> None:
        if role not in role_permissions():
            raise ValueError(f"{role} is not a predefined role the vendored data knows")
        with self._lock:
            self._bindings.setdefault(on or f"projects/{self.project}", {}).setdefault(member, set()).add(role)

    def revoke(self, member: str, role: str, on: str | None = None) -> None:
        with self._lock:
            self._bindings.get(on or f"projects/{self.project}", {}).get(member, set()).discard(role)

    def forget(self, member: str) -> None:
        """Every binding of `member`, wherever it was granted, removed."""
        with self._lock:
            for members in self._bindings.values():
                members.pop(member, None)

    def roles(self, member: str, resource: str) -> set[str]:
        """The roles `member` holds on `resource`, its own and its project's."""
        with self._lock:
            held = set(self._bindings.get(resource, {}).get(member, ()))
            if resource != f"projects/{self.project}":
                held |= self._bindings.get(f"projects/{self.project}", {}).get(member, set())
            return held

    def holds(self, member: str, permission: str, resource: str) -> bool:
        return any(permission in role_permissions()[role] for role in self.roles(member, resource))

    def check(self, member: str, permissions: tuple[str, ...], resource: str, domain: str) -> None:
        for permission in permissions:
            with self._lock:
                self.checked.append((member, permission, resource))
            if not self.holds(member, permission, resource):
                raise Denied(403, "PERMISSION_DENIED",
                             f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
                             [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED",
                               "domain": domain, "metadata": {"permission": permission, "resource": resource}}])

    # -- tokens -------------------------------------------------------------------------------
    def credentials_file(self, member: str, token_uri: str, folder: Path) -> Path:
        """A service account key file (the JSON `gcloud iam service-accounts keys create` writes) for `member`,
        whose `token_uri` is the fake's OAuth endpoint: google-auth signs a JWT with its key and trades it there
        (RFC 7523) for an access token, as it does at oauth2.googleapis.com."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        email = member.split(":", 1)[1]
        path = folder / f"credentials-{next(self._serial)}.json"
        path.write_text(json.dumps({"type": "service_account", "project_id": self.project,
                                    "private_key_id": secrets.token_hex(20), "private_key": pem,
                                    "client_email": email, "client_id": str(next(self._serial)),
                                    "token_uri": token_uri}))
        with self._lock:
            self._keys[email] = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        return path

    def mint(self, assertion: str) -> dict:
        """The OAuth token endpoint's answer to a JWT-bearer grant (RFC 7523 2.1): the assertion must be signed by
        a key this fake issued, and names the service account in `iss`."""
        from google.auth import exceptions, jwt

        try:
            issuer = jwt.decode(assertion, verify=False)["iss"]
            with self._lock:
                key = self._keys[issuer]
            # google-auth names Google's endpoint as the audience whatever token_uri says, as Google requires
            jwt.decode(assertion, certs=key, verify=True, audience="https://oauth2.googleapis.com/token")
        except (KeyError, ValueError, exceptions.GoogleAuthError):
            raise Denied(400, "invalid_grant", "Invalid JWT Signature.", []) from None
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = f"serviceAccount:{issuer}"
        return {"access_token": token, "expires_in": TOKEN_SECONDS, "token_type": "Bearer"}

    def caller(self, authorization: str | None) -> str:
        """The member whose token this Authorization header carries; 401 as Google answers a missing or unknown
        token."""
        token = (authorization or "").removeprefix("Bearer ").strip()
        with self._lock:
            member = self._tokens.get(token)
        if member is None and token.count(".") == 2:
            member = self._self_signed(token)
        if member is None:
            raise Denied(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 "
                         "access token, login cookie or other valid authentication credential.", [])
        return member

    def _self_signed(self, token: str) -> str | None:
        """A service account's self-signed JWT, which the GAPIC clients send instead of an access token
        (developers.google.com/identity/protocols/oauth2/service-account#jwt-auth): its signature checked with
        the account's key, its `iss` the account."""
        from google.auth import exceptions, jwt

        try:
            issuer = jwt.decode(token, verify=False)["iss"]
            with self._lock:
                key = self._keys[issuer]
            jwt.decode(token, certs=key, verify=True, audience=None)
        except (KeyError, ValueError, exceptions.GoogleAuthError):
            return None
        return f"serviceAccount:{issuer}"
