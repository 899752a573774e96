"""Plans as text (a terminal), markdown (a pull-request comment) and JSON (machines)."""

import json

from rlops.cloud.github import MAX_COMMENT
from rlops.provision.plan import Action, Change, Plan

GITHUB_COMMENT_LIMIT = MAX_COMMENT  # a plan is split into comments GitHub takes
# Between the comments of `plan --format markdown`: `rlops github comment` posts each part as one.
MARKDOWN_SPLIT = "<!-- rlops: next comment -->"
SYMBOL = {Action.CREATE: "+", Action.UPDATE: "~", Action.REPLACE: "-/+", Action.DELETE: "-", Action.ADOPT: "=",
          Action.NOOP: " "}


def _value(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def change_lines(change: Change) -> list[str]:
    """One change as diff-like lines: the resource, then one line per field."""
    head = f"{SYMBOL[change.action]} {change.key}"
    if change.reason:
        head += f"  ({change.reason})"
    lines = [head]
    if change.action == Action.CREATE:
        lines += [f"    {name}: {_value(value)}" for name, value in change.resource.desired.items()
                  if value is not None and name != "system_pool"]
    else:
        lines += [f"    {c.field}: {_value(c.before)} -> {_value(c.after)}"
                  + ("  (immutable)" if c.mutability.value == "immutable" else "") for c in change.fields]
    return lines


def _visible(plan: Plan) -> list[Change]:
    return [c for c in plan.changes if c.action != Action.NOOP]


def text(plan: Plan) -> str:
    out = [f"Plan for environment {plan.environment}: {plan.summary()}."]
    for error in plan.errors:
        out.append(f"error: {error}")
    if plan.destructive:
        out.append("")
        out.append("DESTRUCTIVE changes:")
        out += [f"  {SYMBOL[c.action]} {c.key} ({c.action.value}: {c.reason})" for c in plan.destructive]
    for change in _visible(plan):
        out.append("")
        out += change_lines(change)
    if plan.cluster_objects:
        out += ["", "Cluster objects (server-side apply, after the cluster):"] + [f"  {change.line()}" for change in plan.cluster_objects]
    if not plan.has_changes and not plan.errors:
        out.append("No changes: the cloud matches the spec.")
    return "\n".join(out) + "\n"


def as_json(plans: list[Plan]) -> str:
    return json.dumps([{
        "environment": plan.environment,
        "summary": {a.value: plan.count(a) for a in Action if a != Action.NOOP},
        "errors": plan.errors,
        "cluster_objects": [change.summary() for change in plan.cluster_objects],
        "changes": [{
            "address": c.key, "action": c.action.value, "destructive": c.destructive, "reason": c.reason,
            "fields": [{"field": f.field, "before": f.before, "after": f.after, "mutability": f.mutability.value}
                       for f in c.fields],
            "create": ({k: v for k, v in c.resource.desired.items() if k != "system_pool"}
                       if c.action == Action.CREATE else None),
        } for c in plan.changes],
    } for plan in plans], indent=2, sort_keys=True) + "\n"


HEADER_ITEMS = 50  # errors or destructive changes listed in full at the top; the rest are in the details


def _first(items: list[str], what: str) -> list[str]:
    shown = [item[:500] for item in items[:HEADER_ITEMS]]
    return shown + ([f"> - … and {len(items) - HEADER_ITEMS} more {what} (see the details)"] if len(items) > HEADER_ITEMS else [])


def _markdown_header(plan: Plan) -> list[str]:
    lines = [f"### Environment `{plan.environment}`", "", f"**Plan: {plan.summary()}.**", ""]
    if plan.errors:
        lines += ["> [!WARNING]", "> **This plan cannot be applied:**"]
        lines += _first([f"> - {e}" for e in plan.errors], "errors") + [""]
    if plan.destructive:
        lines += ["> [!CAUTION]", "> **Destructive changes**"]
        lines += _first([f"> - **{c.action.value}** `{c.key}`: {c.reason}" for c in plan.destructive],
                        "destructive changes") + [""]
    if not plan.has_changes and not plan.errors:
        lines += ["No changes.", ""]
    return lines


def markdown(plans: list[Plan], limit: int = GITHUB_COMMENT_LIMIT) -> list[str]:
    """The plans as one or more PR comments, each under `limit` characters and valid on its own."""
    blocks: list[tuple[list[str], list[str]]] = []  # (header lines, detail lines) per environment
    for plan in plans:
        details = [line for change in _visible(plan) for line in change_lines(change) + [""]]
        details += [f"{change.line()}  (cluster object)" for change in plan.cluster_objects]
        blocks.append((_markdown_header(plan), details))
    room = limit - 200  # the part marker and the fences of a details block
    comments: list[list[str]] = [[]]

    def size(lines: list[str]) -> int:
        return sum(len(line) + 1 for line in lines)

    def add(lines: list[str]) -> None:
        if comments[-1] and size(comments[-1]) + size(lines) > room:
            comments.append([])
        comments[-1].extend(lines)

    for header, details in blocks:
        add(header)
        chunk: list[str] = []
        for line in details:
            line = line if len(line) < room // 2 else line[: room // 2] + " …"
            if size(chunk) + len(line) + 1 > room - size(header):
                add(_details(chunk))
                chunk = []
            chunk.append(line)
        if chunk:
            add(_details(chunk))
    if len(comments) == 1:
        return ["\n".join(comments[0]).rstrip() + "\n"]
    return [f"_Plan part {i} of {len(comments)}_\n\n" + "\n".join(lines).rstrip() + "\n"
            for i, lines in enumerate(comments, 1)]


def _details(lines: list[str]) -> list[str]:
    return ["<details><summary>Show changes</summary>", "", "```diff", *lines, "```", "</details>", ""]
