"""GitHub's REST API, for the pull-request pipeline: the plan comment and the approval label.

The token comes from GITHUB_TOKEN (Cloud Build fills it from Secret Manager through
`availableSecrets`); it is sent in the Authorization header and never printed. `Endpoints.github`
(RLOPS_GITHUB_API) points at another API server (tests: a local one).

The plan is one or more comments (GitHub caps a comment at 65,536 characters), each starting with
a hidden marker `<!-- rlops-plan i/n -->`: a later run edits them in place, adds what is missing
and deletes what is left over, so a pull request carries one current plan however often it runs.
"""

import base64
import json
import os
import re
import urllib.error
import urllib.request
from typing import Any

from rlops.errors import Failure

MAX_COMMENT = 65_536
MARKER = re.compile(r"^<!-- rlops-plan (\d+)/(\d+) -->")


class GitHubError(Failure):
    pass


def git_credentials(remote: str) -> dict[str, str]:
    """Environment for git that sends GITHUB_TOKEN as GitHub's HTTP Basic credentials (`x-access-token`) to the
    host of `remote` alone (`http.https://github.com/.extraHeader`: not to a submodule's or a redirect's host),
    through git's GIT_CONFIG_* variables, so it is in no URL, argument or remote config; git never prompts."""
    token = os.environ.get("GITHUB_TOKEN")
    if not token:
        raise GitHubError("GITHUB_TOKEN is not set (in Cloud Build: availableSecrets from Secret Manager); a private "
                          "repository's history cannot be fetched without it")
    host = re.match(r"[a-z][a-z0-9+.-]*://[^/]+/", remote)
    if host is None:
        raise GitHubError(f"origin is {remote!r}, not an http(s) URL: the token is sent to an HTTP host only")
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"http.{host[0]}.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}", "GIT_TERMINAL_PROMPT": "0"}


class GitHub:
    def __init__(self, repository: str, api: str, token: str | None = None):
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
            raise GitHubError(f"--repo {repository!r}: expected OWNER/NAME")
        self.repository = repository
        self.api = api.rstrip("/")
        self._token = token or os.environ.get("GITHUB_TOKEN")
        if not self._token:
            raise GitHubError("GITHUB_TOKEN is not set (in Cloud Build: availableSecrets from Secret Manager)")

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        """GitHub's answer as JSON, unchecked (Any: None where it sends no body, a DELETE's)."""
        request = urllib.request.Request(
            f"{self.api}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self._token}", "Accept": "application/vnd.github+json",
                     "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json",
                     "User-Agent": "rlops"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            raise GitHubError(f"GitHub {method} {path}: {error.code} {detail}") from None
        except OSError as error:
            raise GitHubError(f"GitHub {method} {path}: cannot reach {self.api}: {error}") from None
        return json.loads(data) if data else None

    def labels(self, pull: int) -> set[str]:
        return {label["name"] for label in self._pages(f"/repos/{self.repository}/issues/{pull}/labels")}

    def _comments(self, pull: int) -> list[dict]:
        return self._pages(f"/repos/{self.repository}/issues/{pull}/comments")

    def _pages(self, path: str) -> list[dict]:
        """Every item of a paginated list (GitHub gives 30 a page unless asked, 100 at most)."""
        items, page = [], 1
        while True:
            batch = self._call("GET", f"{path}?per_page=100&page={page}")
            items += batch
            if len(batch) < 100:
                return items
            page += 1

    def post_plan(self, pull: int, parts: list[str]) -> list[str]:
        """Make the pull request's plan comments `parts`; what was done, one line per comment."""
        bodies = [f"<!-- rlops-plan {i}/{len(parts)} -->\n{part}" for i, part in enumerate(parts, 1)]
        for body in bodies:
            if len(body) > MAX_COMMENT:
                raise GitHubError(f"a plan comment has {len(body)} characters, more than GitHub's {MAX_COMMENT}")
        ours = sorted((int(marker.group(1)), c) for c in self._comments(pull)
                      if (marker := MARKER.match(c.get("body") or "")))
        done = []
        for i, body in enumerate(bodies, 1):
            existing = next((c for n, c in ours if n == i), None)
            if existing is None:
                created = self._call("POST", f"/repos/{self.repository}/issues/{pull}/comments", {"body": body})
                done.append(f"created comment {created['id']} ({i}/{len(bodies)})")
            elif existing["body"] != body:
                self._call("PATCH", f"/repos/{self.repository}/issues/comments/{existing['id']}", {"body": body})
                done.append(f"updated comment {existing['id']} ({i}/{len(bodies)})")
            else:
                done.append(f"comment {existing['id']} unchanged ({i}/{len(bodies)})")
        for n, comment in ours:
            if n > len(bodies):
                self._call("DELETE", f"/repos/{self.repository}/issues/comments/{comment['id']}")
                done.append(f"deleted comment {comment['id']} (the plan is shorter now)")
        return done
