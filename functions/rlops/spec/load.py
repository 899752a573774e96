"""Loading an environment spec: file -> YAML -> typed model -> cross-field rules.

Every problem found is reported with its file, line, column and field path; nothing stops at
the first one. Structural problems (types, unknown keys) and the cross-field rules are two
passes: the rules need a structurally valid spec to reason about.
"""

import difflib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel, TypeAdapter
from pydantic_core import ErrorDetails

from rlops.errors import Failure
from rlops.spec import inline_secrets, nemo_rl, nemo_rl_upgrade, recipe_rules, rules
from rlops.spec.field_types import PATTERN_HINTS
from rlops.spec.model import ROOT_MODELS, EnvironmentSpec, GcpEnvironment, LocalEnvironment
from rlops.spec.source import Document, Problem, parse_text, read_document

ENVIRONMENT_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")
_ADAPTER = TypeAdapter(EnvironmentSpec)
_EXPECTED = {"string_type": "a string", "int_type": "an integer", "float_type": "a number",
             "bool_type": "true or false", "dict_type": "a mapping", "model_type": "a mapping",
             "model_attributes_type": "a mapping",
             "list_type": "a list", "none_required": "nothing (null)"}


@dataclass
class Loaded:
    name: str
    file: str
    environment: GcpEnvironment | LocalEnvironment | None
    problems: list[Problem]
    notices: list[Problem] = field(default_factory=list)  # what could not be checked, and warnings: valid, no effect


class SpecError(Failure):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(map(str, problems)))


def json_schema() -> dict:
    """The spec's JSON Schema, for editors. pydantic writes the provider union as a `oneOf` (its `discriminator` is
    OpenAPI's, which JSON Schema validators ignore), so yaml-language-server and jsonschema reported any typo as the
    whole file matching no branch; `provider` picks the branch with if/then instead, and each problem is reported at
    its own key."""
    schema = _ADAPTER.json_schema()
    branches = schema.pop("discriminator")["mapping"]
    del schema["oneOf"]
    kinds = " ".join(model.model_fields["provider"].description or "" for model in ROOT_MODELS.values())
    schema.update({
        "title": "rlops environment",
        "description": "An environment spec, environments/NAME.yaml: where rlops builds a training cluster, and the "
                       "recipes it runs there.",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["provider"],
        "properties": {"provider": {"enum": list(branches), "description": f"Which kind of environment; it decides "
                                    f"the other keys. {kinds}"}},
        "allOf": [{"if": {"properties": {"provider": {"const": provider}}, "required": ["provider"]},
                   "then": {"$ref": ref}} for provider, ref in branches.items()],
    })
    return schema


def load(path: Path, display_name: str | None = None) -> Loaded:
    """Read and check one spec file; `environment` is set only when there is no problem."""
    return _check(read_document(path, display_name), path.stem)


def load_text(text: str, name: str, display_name: str) -> Loaded:
    """Check a spec given as text (e.g. read from git at another revision)."""
    return _check(parse_text(text, Document(file=display_name)), name)


def _check(doc: Document, name: str) -> Loaded:
    if not ENVIRONMENT_NAME.match(name):
        doc.problems.append(Problem(doc.file, 1, 1, "(file name)",
                                    f"environment name {name[:40]!r} (the file name) must be 1-30 lowercase letters, "
                                    "digits or hyphens, starting with a letter; rename the file"))
    if doc.data is None:
        return Loaded(name, doc.file, None, doc.problems)
    for secret_path, kind in inline_secrets.find(doc.data):
        doc.problems.append(doc.problem(secret_path,
                                        f"looks like an inline {kind}; a spec holds only references: "
                                        "store the value in Secret Manager and name it under secrets:"))
    environment = _validate(doc)
    notices = []
    if environment is not None:
        for finding_path, message in rules.check(environment):
            doc.problems.append(doc.problem(finding_path, message))
        notices = [doc.problem(path, "not checked: " + message) for path, message in recipe_rules.notices(environment)]
        notices += [doc.problem(path, "warning: " + message) for path, message in recipe_rules.warnings(environment)]
    doc.problems.sort(key=lambda p: (p.line, p.column))
    return Loaded(name, doc.file, None if doc.problems else environment, doc.problems, notices)


def preview_upgrade(path: Path, target: str) -> tuple[Loaded, list[str], bool]:
    """What moving each nemo-rl recipe of a valid spec to NeMo RL `target` changes (`rlops validate --tag`): the lines
    to print, and whether anything changes meaning."""
    doc = read_document(path)
    loaded = _check(doc, path.stem)
    env = loaded.environment
    if not isinstance(env, GcpEnvironment):
        return loaded, [], False
    source, lines, changes = nemo_rl.tag_for(env.ray.image), [], False
    for name, recipe in env.recipes.items():
        if recipe.runner != "nemo-rl":
            continue
        if source is None:
            lines.append(str(doc.problem(("ray", "image"), f"not previewed: {nemo_rl.unsupported(env.ray.image)}")))
            continue
        pool = recipe_rules.pool_of(env, recipe)
        upgrade = nemo_rl_upgrade.preview(name, recipe, pool, source, nemo_rl.tags()[target])
        changes = changes or upgrade.changes_meaning
        lines += nemo_rl_upgrade.report(
            upgrade, lambda where, message, name=name: str(doc.problem(("recipes", name) + where, message)))
    return loaded, lines, changes


def load_or_raise(path: Path) -> GcpEnvironment | LocalEnvironment:
    loaded = load(path)
    if loaded.problems or loaded.environment is None:
        raise SpecError(loaded.problems)
    return loaded.environment


def _validate(doc: Document) -> GcpEnvironment | LocalEnvironment | None:
    try:
        return _ADAPTER.validate_python(doc.data)
    except pydantic.ValidationError as error:
        provider = doc.data.get("provider")
        grouped: dict[tuple, list[str]] = {}
        key_errors: set[tuple] = set()
        for item in error.errors(include_url=False):
            loc = tuple(item["loc"])
            if loc and loc[0] == provider and provider in ROOT_MODELS:
                loc = loc[1:]
            if item["type"] in ("union_tag_invalid", "union_tag_not_found"):
                path, on_key = ("provider",), False
            else:
                path, on_key = _data_path(loc, doc.data, item["type"])
            if on_key:
                key_errors.add(path)
            message = _message(item, path, provider)
            grouped.setdefault(path, [])
            if message not in grouped[path]:
                grouped[path].append(message)
        for path, messages in grouped.items():
            doc.problems.append(doc.problem(path, " | ".join(messages), prefer_key=path in key_errors))
        return None


def _data_path(loc: tuple, data: Any, error_type: str) -> tuple[tuple, bool]:
    """The part of a pydantic location that names something in the file (or a missing key in it)."""
    path: tuple = ()
    current = data
    for part in loc:
        if part == "[key]":
            return path, True
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            if error_type == "missing" and isinstance(part, str) and isinstance(current, dict):
                return path + (part,), False
            return path, False
        path += (part,)
    return path, error_type == "extra_forbidden"


def _message(item: ErrorDetails, path: tuple, provider: Any) -> str:
    kind, ctx, value = item["type"], item.get("ctx") or {}, item.get("input")
    if kind in ("union_tag_invalid", "union_tag_not_found") or (kind == "missing" and path == ("provider",)):
        given = _show(value["provider"]) if isinstance(value, dict) and "provider" in value else "missing"
        return f"provider is {given}; use provider: gcp or provider: local"
    if kind == "missing":
        return "required field is missing; add it"
    if kind == "extra_forbidden":
        allowed = _fields_at(ROOT_MODELS.get(provider), path[:-1])
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {close[0]}?"
        return f"unknown key; allowed here: {', '.join(allowed)}" if allowed else "unknown key; remove it"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        hint = PATTERN_HINTS.get(pattern, "a value matching " + pattern)
        return f"{_show(value)} is not valid; expected {hint}"
    if kind == "literal_error":
        return f"{_show(value)} is not allowed; use {ctx.get('expected')}"
    if kind in _EXPECTED:
        hint = "; quote it" if kind == "string_type" and isinstance(value, (int, float, bool)) else ""
        return f"expected {_EXPECTED[kind]}, got {_yaml_kind(value)}{hint or _type_hint(kind, value)}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return f"{_show(value)} is out of range; {item['msg'].removeprefix('Input ').replace('should be', 'must be')}"
    if kind in ("string_too_long", "string_too_short", "too_long", "too_short"):
        bound = ctx.get("max_length", ctx.get("min_length"))
        unit = "characters" if kind.startswith("string") else "items"
        limit = "at most" if kind.endswith("long") else "at least"
        return f"{_show(value)} has {_length(value)} {unit}; use {limit} {bound}"
    return f"{item['msg']}; check the spec reference in docs/spec.md"


def _type_hint(kind: str, value: Any) -> str:
    if kind in ("int_type", "float_type") and isinstance(value, str):
        return "; write the number without quotes"
    if kind == "bool_type" and isinstance(value, str):
        return "; write true or false without quotes"
    return f"; write {_EXPECTED[kind]} here"


def _fields_at(model: type[BaseModel] | None, path: tuple) -> list[str]:
    """The field names of the model found at `path` under `model`, for a did-you-mean."""
    annotation: Any = model
    for part in path:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
            annotation = annotation.model_fields[part].annotation
        elif typing.get_origin(annotation) in (dict, list):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) in (typing.Union, typing.Annotated) or type(annotation).__name__ == "UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        annotation = models[0] if models else args[0]
    return annotation


def _length(value: Any) -> str:
    return str(len(value)) if isinstance(value, (str, list, dict)) else "the wrong number of"


def _yaml_kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A value fit to print in an error: short, and never something that looks like a secret."""
    if isinstance(value, str) and (len(value) > 60 or inline_secrets.secret_kind(value)):
        return "this value"
    if isinstance(value, (dict, list)):
        return _yaml_kind(value)
    return repr(value)
