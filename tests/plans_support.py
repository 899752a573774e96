"""Plans of edited seed specs, the pure core alone (no I/O): a seed's text edited, planned against the cloud as an
apply of the unedited spec left it. Shared by the plan classification, plan rendering and environment cost tests."""

from functools import cache

from conftest import ENVIRONMENTS
from rlops.provision.plan import Plan, build_plan
from rlops.provision.resources import KINDS, build
from rlops.resource_shapes import Live
from rlops.spec.load import load_text
from rlops.spec.model import GcpEnvironment


def seed(name: str) -> str:
    return (ENVIRONMENTS / f"{name}.yaml").read_text()


def edit(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in the spec exactly once"
        text = text.replace(old, new)
    return text


@cache
def environment(text: str, name: str) -> GcpEnvironment:
    loaded = load_text(text, name, f"{name}.yaml")
    assert not loaded.problems, "\n".join(map(str, loaded.problems))
    return loaded.environment


def live_of(name: str, env: GcpEnvironment) -> dict[str, Live]:
    """The cloud as an apply of `env` left it: every resource, owned, with the fields the plan compares."""
    return {r.key: Live({f: v for f, v in r.desired.items() if f in KINDS[r.kind].fields and v is not None},
                        True, r.depends_on)
            for r in build(name, env)}


def plan_edit(name: str, *edits: tuple[str, str], base: str | None = None, live: dict[str, Live] | None = None) -> Plan:
    """Plan `base` (the seed by default) with `edits` applied against the cloud `base` left (or `live`)."""
    base = seed(name) if base is None else base
    if live is None:
        live = live_of(name, environment(base, name))
    return build_plan(name, build(name, environment(edit(base, *edits), name)), live)
