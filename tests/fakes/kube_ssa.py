"""Server-side apply as the API server does it, for the fake: field sets per manager, merge by the
list-map keys a schema declares, pruning of what a manager stopped applying, conflicts, and the
ownership an update (a JSON patch, `kubectl edit`) takes.

The rules, and where they come from (kubernetes-sigs/structured-merge-diff v4, which the API server
runs; docs: kubernetes.io/docs/reference/using-api/server-side-apply/):
- A manager's set is every leaf it applied, plus each list-map item it applied (`k:{...}` with
  `.`); an empty map it applied is a leaf (fieldpath/set.go, typed/helpers.go).
- Maps and structs merge field by field unless `x-kubernetes-map-type: atomic`; lists merge item
  by item only with `x-kubernetes-list-type: map` (by `x-kubernetes-list-map-keys`) or `set`.
  A list without a list type is atomic: one field, replaced whole (the CRD docs, "Merge strategy":
  atomic is the default for lists in CRD schemas; typed/merge.go).
- A list-map key a config leaves out is read with its schema default (SMD's defaulted-key
  handling, kubernetes#112220).
- Apply: fields the manager applied before and no longer applies are removed unless another
  manager owns them (merge/update.go `prune`); the config is merged over the live object.
- A field another manager owns with a different value is a conflict (409); `force=true` takes it
  over. The same value: both own it (merge/conflict.go).
- An update (PUT, JSON/merge patch) gives its manager every field it changed and takes them from
  the others (merge/update.go `Update`).
"""

import copy
import json

MISSING = object()


class Schema:
    """One node of an OpenAPI v3 schema (a CRD's, or a built-in kind's transcribed in kube_rules)."""

    def __init__(self, node: dict | None):
        self.node = node or {}

    def field(self, name: str) -> "Schema":
        properties = self.node.get("properties") or {}
        if name in properties:
            return Schema(properties[name])
        extra = self.node.get("additionalProperties")
        return Schema(extra if isinstance(extra, dict) else None)

    def item(self) -> "Schema":
        return Schema(self.node.get("items"))

    @property
    def list_type(self) -> str:
        return self.node.get("x-kubernetes-list-type") or "atomic"

    @property
    def atomic_map(self) -> bool:
        return self.node.get("x-kubernetes-map-type") == "atomic"

    def key_of(self, item: dict) -> tuple:
        """A list-map item's key: ("k", ((name, value), ...)), absent keys at their schema default."""
        element = self.item()
        return ("k", tuple((name, item.get(name, element.field(name).node.get("default")))
                           for name in self.node.get("x-kubernetes-list-map-keys") or []))


def field_set(value, schema: Schema, prefix: tuple = ()) -> set[tuple]:
    """Every field path `value` sets: what a manager owns when it applies `value`."""
    if isinstance(value, dict) and value and not schema.atomic_map:
        paths: set[tuple] = set()
        for key, child in value.items():
            paths |= field_set(child, schema.field(key), prefix + (key,))
        return paths
    if isinstance(value, list) and schema.list_type == "map" and prefix:
        paths = set()
        for item in value:
            item_path = prefix + (schema.key_of(item),)
            paths |= {item_path} | field_set(item, schema.item(), item_path)
        return paths
    if isinstance(value, list) and schema.list_type == "set" and prefix:
        return {prefix + (("v", _frozen(item)),) for item in value}
    return {prefix} if prefix else set()


def value_at(obj, path: tuple, schema: Schema):
    for element in path:
        if isinstance(element, tuple) and element[0] == "k" and isinstance(obj, list):
            obj = next((item for item in obj if schema.key_of(item) == element), MISSING)
            schema = schema.item()
        elif isinstance(element, tuple) and element[0] == "v" and isinstance(obj, list):
            obj = element[1] if element[1] in map(_frozen, obj) else MISSING
            schema = schema.item()
        elif isinstance(obj, dict) and not isinstance(element, tuple):
            obj = obj.get(element, MISSING)
            schema = schema.field(element)
        else:
            return MISSING
        if obj is MISSING:
            return MISSING
    return obj


def merge(live, config, schema: Schema):
    """`config` over `live`: maps field by field, list-maps item by item (live order, new items after)."""
    if isinstance(config, dict) and isinstance(live, dict) and not schema.atomic_map:
        merged = copy.deepcopy(live)
        for key, value in config.items():
            merged[key] = merge(live[key], value, schema.field(key)) if key in live else copy.deepcopy(value)
        return merged
    if isinstance(config, list) and isinstance(live, list) and schema.list_type == "map":
        wanted = {schema.key_of(item): item for item in config}
        merged = [merge(item, wanted.pop(schema.key_of(item)), schema.item()) if schema.key_of(item) in wanted
                  else copy.deepcopy(item) for item in live]
        return merged + [copy.deepcopy(item) for item in wanted.values()]
    if isinstance(config, list) and isinstance(live, list) and schema.list_type == "set":
        return copy.deepcopy(live) + [copy.deepcopy(v) for v in config if _frozen(v) not in map(_frozen, live)]
    return copy.deepcopy(config)


def remove(obj, path: tuple, schema: Schema) -> None:
    """Remove the field at `path`, and the maps and list items it leaves empty."""
    if not path:
        return
    *parents, last = path
    containers = [(obj, schema)]
    for element in parents:
        parent, parent_schema = containers[-1]
        child = value_at(parent, (element,), parent_schema)
        if child is MISSING:
            return
        containers.append((child, _child_schema(parent_schema, element)))
    target, _ = containers[-1]
    _drop(target, last, containers[-1][1])
    for depth in range(len(parents) - 1, -1, -1):
        parent, parent_schema = containers[depth]
        child = containers[depth + 1][0]
        if child in ({}, []) and not isinstance(parents[depth], tuple):
            _drop(parent, parents[depth], parent_schema)


def _drop(container, element, schema: Schema) -> None:
    if isinstance(element, tuple) and isinstance(container, list):
        match = (lambda item: schema.key_of(item) == element) if element[0] == "k" else \
            (lambda item: _frozen(item) == element[1])
        container[:] = [item for item in container if not match(item)]
    elif isinstance(container, dict):
        container.pop(element, None)


def _child_schema(schema: Schema, element) -> Schema:
    return schema.item() if isinstance(element, tuple) else schema.field(element)


def changed_paths(before: dict, after: dict, schema: Schema) -> set[tuple]:
    """The fields an update changed: set or changed in `after`, or gone from `before`."""
    now, then = field_set(after, schema), field_set(before, schema)
    changed = {p for p in now if value_at(before, p, schema) != value_at(after, p, schema)}
    return changed | (then - now)


def _frozen(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def fields_v1(paths: set[tuple]) -> dict:
    """A field set as the API server shows it in `metadata.managedFields[].fieldsV1`."""
    tree: dict = {}
    for path in sorted(paths, key=repr):
        node = tree
        for element in path:
            if isinstance(element, tuple) and element[0] == "k":
                name = "k:" + json.dumps(dict(element[1]), separators=(",", ":"), sort_keys=True)
                node = node.setdefault(name, {})
                node.setdefault(".", {})
            elif isinstance(element, tuple):
                node = node.setdefault("v:" + json.dumps(element[1]), {})
            else:
                node = node.setdefault(f"f:{element}", {})
    return tree
