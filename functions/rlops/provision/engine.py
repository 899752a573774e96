"""Reading live state and carrying out a plan: the only part of provisioning that does I/O.

Reads all go out at once (one round trip however many resources and environments). A plan runs
as steps on a dependency graph: a step starts when the steps it needs are done, so independent
resources are created side by side; GKE takes one operation per cluster at a time, so the
cluster's own steps are serialized. After every finished step the resource record in the state
bucket is written, so an apply killed at any point is finished by running it again.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from rlops.cloud.base import CloudError, Pending, Read, ResourceAdapter, is_conflict
from rlops.errors import Failure
from rlops.provision.plan import Action, Change, Plan
from rlops.provision.resources import DELETED_AFTER
from rlops.resource_shapes import Live, Resource
from rlops.state.resources import ResourceRecord


@dataclass
class Workspace:
    """One environment's resources, adapters (by kind) and resource record."""

    name: str
    desired: list[Resource]
    adapters: dict[str, ResourceAdapter]
    record: ResourceRecord

    def __post_init__(self) -> None:
        self.by_key = {resource.key: resource for resource in self.desired}

    def locator(self, key: str) -> dict:
        """The fields an adapter needs to find `key` (its region, zone or cluster)."""
        if key in self.by_key:
            return self.by_key[key].desired
        return self.record.resources.get(key, {}).get("fields", {})


def read_live(workspaces: list[Workspace]) -> dict[str, dict[str, Live]]:
    """Live state of every workspace, all reads in parallel: {workspace name: {key: Live}}.

    Each distinct call is made once: environments of one project share the lists of its networks,
    clusters and Lustre instances, so a fleet's plan costs about what one environment's does.
    """
    wanted = read_plan(workspaces)
    calls = {read.call: read.fetch for per_workspace in wanted for read in per_workspace}
    live: dict[str, dict[str, Live]] = {ws.name: {} for ws in workspaces}
    # A thread per call: they spend their time waiting on the network, so a plan costs one round trip.
    with ThreadPoolExecutor(max_workers=max(1, min(256, len(calls))), thread_name_prefix="read") as pool:
        answers = dict(zip(calls, pool.map(lambda fetch: fetch(), calls.values()), strict=True))
    for ws, reads in zip(workspaces, wanted, strict=True):
        for read in reads:
            for key, found in read.pick(answers[read.call]).items():
                if found is not None:
                    live[ws.name][key] = _with_ownership(ws, key, found)
    return live


def read_plan(workspaces: list[Workspace]) -> list[list[Read]]:
    """Per workspace, the reads that together cover every resource it knows of."""
    plans = []
    for ws in workspaces:
        keys = list(ws.by_key) + [k for k in ws.record.resources if k not in ws.by_key]
        by_adapter: dict[int, tuple[ResourceAdapter, list]] = {}
        for key in keys:
            kind, name = key.split("/", 1)
            adapter = ws.adapters[kind]
            by_adapter.setdefault(id(adapter), (adapter, []))[1].append((kind, name, ws.locator(key)))
        plans.append([read for adapter, items in by_adapter.values() for read in adapter.reads(items)])
    return plans


def _with_ownership(ws: Workspace, key: str, found: Live) -> Live:
    # What the record lists is rlops's even where the API has no labels (a peering), and its
    # dependencies are known even after the spec dropped it.
    recorded = ws.record.resources.get(key)
    wanted = ws.by_key.get(key)
    depends_on = tuple(recorded["depends_on"]) if recorded else (wanted.depends_on if wanted else found.depends_on)
    return Live(found.fields, found.owned or recorded is not None, depends_on, found.settling)


@dataclass
class Step:
    verb: str                 # create, update, delete, record
    change: Change
    needs: set[tuple[str, str]] = field(default_factory=set)

    @property
    def id(self) -> tuple[str, str]:
        return (self.verb, self.change.key)

    def label(self) -> str:
        return f"{self.verb} {self.change.key}"


def steps_for(plan: Plan) -> list[Step]:
    """The plan as steps with their dependencies (creates after what they need, deletes before it)."""
    steps: dict[tuple[str, str], Step] = {}
    changes = {c.key: c for c in plan.changes}
    for change in plan.changes:
        if change.action in (Action.DELETE, Action.REPLACE):
            steps[("delete", change.key)] = Step("delete", change)
        if change.action in (Action.CREATE, Action.REPLACE):
            steps[("create", change.key)] = Step("create", change)
        elif change.action == Action.UPDATE:
            steps[("update", change.key)] = Step("update", change)
        elif change.action == Action.ADOPT or (change.action == Action.NOOP and change.reason.startswith("created by")):
            steps[("record", change.key)] = Step("record", change)
    for step in steps.values():
        key = step.change.key
        if step.verb == "delete":
            # Whatever is built on this, now or in the spec, goes first.
            step.needs = {("delete", c.key) for c in plan.changes
                          if (key in c.depends_on or key in c.live_depends_on
                              or c.kind in DELETED_AFTER.get(step.change.kind, ()))
                          and ("delete", c.key) in steps and c.key != key}
        else:
            step.needs = {(verb, d) for d in step.change.depends_on for verb in ("create", "update", "record")
                          if (verb, d) in steps}
            if ("delete", key) in steps:
                step.needs.add(("delete", key))
            parent = step.change.resource.created_with if step.change.resource else None
            if step.verb == "record" and parent and ("create", parent) in steps:
                step.needs.add(("create", parent))
    return [step for step in steps.values() if step.change.key in changes]


class ApplyFailed(Failure):
    pass


@dataclass
class Runner:
    workspace: Workspace
    report: Callable[[str], None]
    # Operations are polled often at first (most compute ones finish in seconds), then every max_poll_seconds.
    first_poll_seconds: float = 0.2
    max_poll_seconds: float = 5.0
    progress_seconds: float = 30.0
    max_parallel: int = 8
    on_step: Callable[[Step], None] = lambda step: None  # told as each step starts (a dry run's transcript)
    _started: float = field(default_factory=time.monotonic)
    _serial: dict[str, threading.Lock] = field(default_factory=dict)
    _running: dict[str, float] = field(default_factory=dict)

    def _say(self, text: str) -> None:
        self.report(f"[{time.monotonic() - self._started:6.1f}s] {text}")

    def _serial_lock(self, change: Change) -> "threading.Lock | None":  # quoted: a function at run time
        if change.kind in ("cluster", "node_pool"):
            return self._serial.setdefault("container", threading.Lock())
        return None

    def settle(self, live: dict[str, Live]) -> None:
        """Wait for resources an interrupted apply left half-created (a cluster still PROVISIONING)."""
        for key, state in live.items():
            # `Live.settling` is an object to resource_shapes, which sits below cloud.base: the adapters put a Pending.
            if isinstance(state.settling, Pending):
                self._say(f"waiting for {key}: {state.settling.description}")
                self._wait(state.settling)

    def run(self, plan: Plan) -> None:
        steps = {s.id: s for s in steps_for(plan)}
        done: set[tuple[str, str]] = set()
        failures: list[str] = []
        futures: dict[Future, Step] = {}
        with ThreadPoolExecutor(max_workers=self.max_parallel, thread_name_prefix="apply") as pool:
            while steps or futures:
                if not failures:
                    # At most max_parallel in flight, taken in the plan's order: with one at a time, a run is the
                    # same sequence every time (a dry run's transcript).
                    for step_id, step in list(steps.items()):
                        if len(futures) >= self.max_parallel:
                            break
                        if step.needs <= done:
                            futures[pool.submit(self._run_step, step)] = step
                            del steps[step_id]
                if not futures:
                    break
                finished, _ = wait(futures, timeout=self.progress_seconds, return_when=FIRST_COMPLETED)
                if not finished:
                    waiting = ", ".join(f"{label} ({time.monotonic() - since:.0f}s)"
                                        for label, since in self._running.items())
                    self._say(f"still working: {waiting}")
                for future in finished:
                    step = futures.pop(future)
                    try:
                        future.result()
                        done.add(step.id)
                    except (CloudError, ApplyFailed) as error:
                        failures.append(f"{step.label()}: {error}")
                        self._say(f"FAILED {step.label()}: {error}")
        if failures or steps:
            skipped = [s.label() for s in steps.values()]
            raise ApplyFailed("; ".join(failures) + (f" (not started: {', '.join(skipped)})" if skipped else ""))

    def _run_step(self, step: Step) -> None:
        self.on_step(step)
        change, ws = step.change, self.workspace
        kind, name = change.key.split("/", 1)
        if step.verb == "record":
            ws.record.put(change.key, change.wanted.desired, change.wanted.depends_on)
            self._say(f"recorded {change.key} ({change.reason})")
            return
        adapter = ws.adapters[kind]
        serial = self._serial_lock(change)
        if serial:
            serial.acquire()
        try:
            self._running[step.label()] = time.monotonic()
            if step.verb == "create":
                pending = self._create(adapter, change)
            elif step.verb == "update":
                pending = adapter.update(change.wanted, [f.field for f in change.fields])
            else:
                pending = adapter.delete(kind, name, ws.locator(change.key))
            self._say(f"{step.verb} {change.key}: {pending.description}")
            self._wait(pending)
        finally:
            self._running.pop(step.label(), None)
            if serial:
                serial.release()
        if step.verb == "delete":
            ws.record.remove(change.key)
        else:
            ws.record.put(change.key, change.wanted.desired, change.wanted.depends_on)
        self._say(f"{step.verb}d {change.key}")

    def _create(self, adapter: ResourceAdapter, change: Change) -> Pending:
        try:
            return adapter.create(change.wanted)
        except CloudError as error:
            if not is_conflict(error):
                raise
        # An earlier apply's create got through but was not yet visible when this plan read: wait for it.
        kind, name = change.key.split("/", 1)
        self._say(f"{change.key} exists already (an interrupted apply created it); waiting for it")

        def visible() -> tuple[bool, str | None]:
            live = adapter.read(kind, name, change.wanted.desired)
            if live is None or (isinstance(live.settling, Pending) and not live.settling.poll()[0]):
                return False, None
            if not live.owned:
                return True, "it exists but is not managed by rlops; remove it or adopt it by matching the spec"
            return True, None

        return Pending(f"{change.key} to appear", visible)

    def _wait(self, pending: Pending) -> None:
        error = pending.wait(first_poll_seconds=self.first_poll_seconds, max_poll_seconds=self.max_poll_seconds)
        if error:
            raise ApplyFailed(f"{pending.description} failed: {error}")
