"""Plans as text (a terminal), markdown (a pull-request comment) and JSON (machines)."""

import json

from rlops.cloud.github import MAX_COMMENT
from rlops.costs import HOURS_PER_MONTH, Rate
from rlops.provision.plan import Action, Change, CostChange, Plan, PlanCost

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
        lines += [f"    {name}: {_value(value)}" for name, value in change.wanted.desired.items()
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
    out += plan.kept
    if plan.destructive:
        out.append("")
        out.append("DESTRUCTIVE changes:")
        out += [f"  {SYMBOL[c.action]} {c.key} ({c.action.value}: {c.reason})" for c in plan.destructive]
    for change in _visible(plan):
        out.append("")
        out += change_lines(change)
    if plan.cluster_objects:
        out += ["", "Cluster objects (server-side apply, after the cluster):"]
        out += [f"  {change.line()}" for change in plan.cluster_objects]
    if plan.cost is not None and plan.cost.changes:
        rows = [(c.sign, c.key, _cost_what(c), c.rate.billed, _per_hour(c.usd_per_hour))
                for c in plan.cost.changes]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        out += ["", f"Cost at list prices ({_PRICES}):"]
        # A row's fifth cell, the price per hour, goes last and unpadded: the widths cover the first four only.
        out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + f"  {row[4]}"
                for row in rows]
        out += [f"  {line}" for line in [cost_total(plan.cost), *cost_unpriced(plan.cost)]]
    if not plan.has_changes and not plan.errors:
        out.append("No changes: the cloud matches the spec.")
    return "\n".join(out) + "\n"


_PRICES = "spec/gpus/catalog.yaml and platform_prices.yaml say where each comes from"


def _per_hour(usd: float | None) -> str:
    return "price unknown" if usd is None else f"{'-' if usd < 0 else '+'}${abs(usd):,.2f}/h"


def _cost_what(change: CostChange) -> str:
    """The priced resource as it is after the change, and before where that differs."""
    before, after = change.before, change.after
    if before is not None and after is not None and before.what != after.what:
        return f"{before.what} -> {after.what}"
    return change.rate.what


def cost_total(cost: PlanCost) -> str:
    """One line: the total $/h, the part billed whatever the GPU pools do, a month of it, and what has no price."""
    total, always = cost.usd_per_hour, cost.always_usd_per_hour
    line = f"Total: {_per_hour(total)}"
    if always != total:
        line += f" with every GPU pool up, {_per_hour(always)} always"
    line += f" ({_per_hour(always * HOURS_PER_MONTH).removesuffix('/h')}/month always on, at {HOURS_PER_MONTH} h)"
    return line


def cost_unpriced(cost: PlanCost) -> list[str]:
    """Each change left out of the total, and why."""
    return [f"not counted: {c.key}, " + next(r.source for r in (c.after, c.before) if r and r.usd_per_hour is None)
            for c in cost.unpriced]


def _cost_json(cost: PlanCost | None) -> dict | None:
    if cost is None:
        return None

    def rate(r: Rate | None) -> dict | None:
        return None if r is None else {"what": r.what, "usd_per_hour": r.usd_per_hour, "billed": r.billed,
                                       "source": r.source}

    return {"usd_per_hour": cost.usd_per_hour, "always_usd_per_hour": cost.always_usd_per_hour,
            "unpriced": [c.key for c in cost.unpriced],
            "changes": [{"address": c.key, "usd_per_hour": c.usd_per_hour, "before": rate(c.before),
                         "after": rate(c.after)} for c in cost.changes]}


def as_json(plans: list[Plan]) -> str:
    return json.dumps([{
        "environment": plan.environment,
        "summary": {a.value: plan.count(a) for a in Action if a != Action.NOOP},
        "errors": plan.errors,
        "kept": plan.kept,
        "cluster_objects": [change.summary() for change in plan.cluster_objects],
        "cost": _cost_json(plan.cost),
        "changes": [{
            "address": c.key, "action": c.action.value, "destructive": c.destructive, "reason": c.reason,
            "fields": [{"field": f.field, "before": f.before, "after": f.after, "mutability": f.mutability.value}
                       for f in c.fields],
            "create": ({k: v for k, v in c.wanted.desired.items() if k != "system_pool"}
                       if c.action == Action.CREATE else None),
        } for c in plan.changes],
    } for plan in plans], indent=2, sort_keys=True) + "\n"


HEADER_ITEMS = 50  # errors or destructive changes listed in full at the top; the rest are in the details


def _first(items: list[str], what: str) -> list[str]:
    shown = [item[:500] for item in items[:HEADER_ITEMS]]
    return shown + ([f"> - … and {len(items) - HEADER_ITEMS} more {what} (see the details)"]
                    if len(items) > HEADER_ITEMS else [])


def _markdown_header(plan: Plan) -> list[str]:
    lines = [f"### Environment `{plan.environment}`", "", f"**Plan: {plan.summary()}.**", ""]
    if plan.errors:
        lines += ["> [!WARNING]", "> **This plan cannot be applied:**"]
        lines += _first([f"> - {e}" for e in plan.errors], "errors") + [""]
    if plan.destructive:
        lines += ["> [!CAUTION]", "> **Destructive changes**"]
        lines += _first([f"> - **{c.action.value}** `{c.key}`: {c.reason}" for c in plan.destructive],
                        "destructive changes") + [""]
    if plan.kept:
        lines += [f"- {line}" for line in plan.kept] + [""]
    # Cold start: kube.sync loads the Kubernetes client, which `rlops github comment` (MARKDOWN_SPLIT) needs not.
    from rlops.kube.sync import restarts_pods  # noqa: PLC0415 cold start, as said above

    restarting = [c for c in plan.cluster_objects if restarts_pods(c)]
    if plan.cluster_objects:
        created = sum(1 for c in plan.cluster_objects if c.action in ("create", "wait"))
        named = [f"{c.action} `{c.ref}`" + (f": {', '.join(c.fields[:5])}" if c.fields else "")
                 + (" (**pods restarted**)" if c in restarting else "")
                 for c in plan.cluster_objects if c.action not in ("create", "wait")]
        lines += ["**In the cluster:** " + "; ".join(([f"{created} objects to create"] if created else [])
                                                    + named[:HEADER_ITEMS])
                  + (f"; … and {len(named) - HEADER_ITEMS} more" if len(named) > HEADER_ITEMS else ""), ""]
    if restarting:
        lines += ["> [!IMPORTANT]", "> **Pods restarted:** applying this recreates every pod of "
                  + ", ".join(f"`{c.ref}`" for c in restarting) + " (held while a Ray job is pending or running)", ""]
    if plan.cost is not None and plan.cost.changes:
        lines += ["| | resource | what | billed | $/h |", "|---|---|---|---|---|"]
        lines += [f"| {c.sign} | `{c.key}` | {_cost_what(c)} | {c.rate.billed} | "
                  f"{_per_hour(c.usd_per_hour)} |" for c in plan.cost.changes[:HEADER_ITEMS]]
        lines += ["", f"**{cost_total(plan.cost)}** (list prices; {_PRICES})", ""]
        lines += [f"- {line}" for line in cost_unpriced(plan.cost)] + ([""] if plan.cost.unpriced else [])
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
