"""Every request the fake GCP receives, checked as Google's front ends check it, against Google's own
definitions as the installed client libraries ship them:

- Discovery documents bundled with google-api-python-client (googleapiclient/discovery_cache/documents):
  compute.v1, container.v1, servicenetworking.v1, secretmanager.v1, serviceusage.v1, cloudresourcemanager.v1,
  cloudfunctions.v2, cloudscheduler.v1, iam.v1, pubsub.v1, run.v1, artifactregistry.v1
  (`REVISIONS` lists their revisions).
  The URL must match a method's `flatPath` under the document's `servicePath`; query parameters must be
  the method's or the document's system parameters (a `$` prefix allowed, as in `$alt`); the body must
  fit the method's `request` schema: no unknown field, no field whose description or `readOnly` marks it
  output only, JSON types as the proto3 JSON mapping writes them (int64/uint64 as strings or numbers),
  enum values from `enum`, `pattern`s, and the fields whose `annotations.required` names the method.
- Managed Lustre and Cloud Quotas have no discovery document there: google-cloud-lustre's and
  google-cloud-quotas' REST transports give the URL templates and body fields (`_get_http_options`),
  protobuf's own JSON parser (`json_format.ParseDict`) the types and unknown fields, and the generated
  messages' attribute docs the field behaviours ("Required.", "Output only.").

A violation is answered as the API answers it: 400 INVALID_ARGUMENT with the field's path.
"""

import json
import re
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import googleapiclient

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
# The fake's URL prefix of each API (FakeGcp.endpoints) -> its discovery document.
DISCOVERY = {"/compute/": "compute.v1", "/gke/": "container.v1", "/sn/": "servicenetworking.v1",
             "/sm/": "secretmanager.v1", "/su/": "serviceusage.v1", "/crm/": "cloudresourcemanager.v1",
             "/cf/": "cloudfunctions.v2", "/cs/": "cloudscheduler.v1", "/iam/": "iam.v1", "/pubsub/": "pubsub.v1",
             "/run/": "run.v1", "/ar/": "artifactregistry.v1"}
_INTEGER_FORMATS = {"int32", "uint32", "int64", "uint64"}
_OUTPUT_ONLY = re.compile(r"^\s*(\[Output Only\]|Output only\.|\[Output only\])", re.IGNORECASE)


class Violation(Exception):
    """What the API's front end refuses, with the field's path; 404 for a URL that names no method."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Method:
    id: str
    http_method: str
    pattern: re.Pattern
    query: dict            # name -> parameter schema
    request: str | None    # schema name of the body


@cache
def document(name: str) -> dict:
    return json.loads((DOCUMENTS / f"{name}.json").read_text())


def revisions() -> dict[str, str]:
    return {name: document(name)["revision"] for name in DISCOVERY.values()}


@cache
def methods(name: str) -> tuple[Method, ...]:
    doc = document(name)
    found = []

    def walk(resource: dict) -> None:
        for method in resource.get("methods", {}).values():
            template = "/" + doc["servicePath"] + method.get("flatPath", method["path"])
            pattern = re.escape(template)
            pattern = re.sub(r"\\\{[^}]+\\\}", r"[^/:]+", pattern)  # {project}, {+name} flattened per segment
            query = {k: v for k, v in method.get("parameters", {}).items() if v.get("location") == "query"}
            found.append(Method(method["id"], method["httpMethod"], re.compile(pattern), query,
                                (method.get("request") or {}).get("$ref")))
        for child in resource.get("resources", {}).values():
            walk(child)

    walk(doc)
    return tuple(found)


def check(method: str, path: str, query: dict[str, str], body) -> None:
    """Raises Violation unless Google's definitions admit this request."""
    for prefix, name in DISCOVERY.items():
        if path.startswith(prefix):
            _check_discovery(name, method, path[len(prefix) - 1:] if prefix != "/compute/" else path, query, body)
            return
    if path.startswith("/lustre/"):
        _check_lustre(method, path[len("/lustre"):], query, body)
    if path.startswith("/cq/"):
        _check_gapic(cloudquotas_methods(), "google.api.cloudquotas.v1.CloudQuotas", method, path[len("/cq"):],
                     query, body)


def _discovery_method(name: str, http_method: str, path: str) -> Method | None:
    candidates = [m for m in methods(name) if m.http_method == http_method and m.pattern.fullmatch(path)]
    # Several templates can match one URL (a literal segment is also a {variable}); the most literal wins.
    return max(candidates, key=lambda m: len(m.pattern.pattern.replace("[^/:]+", ""))) if candidates else None


# google.cloud.lustre.v1.Lustre's and Cloud Quotas' RPCs -> the REST method ids Google's IAM pages name them by.
_RPC_IDS = {"ListInstances": "instances.list", "GetInstance": "instances.get", "CreateInstance": "instances.create",
            "UpdateInstance": "instances.patch", "DeleteInstance": "instances.delete",
            "ExportData": "instances.exportData", "ImportData": "instances.importData",
            "GetQuotaInfo": "services.quotaInfos.get", "ListQuotaInfos": "services.quotaInfos.list"}


def method_id(http_method: str, path: str) -> str | None:
    """The id of the REST method a fake-GCP URL calls (as the discovery documents and IAM's tables name it), or
    None for one this module does not know."""
    for prefix, name in DISCOVERY.items():
        if path.startswith(prefix):
            method = _discovery_method(name, http_method, path[len(prefix) - 1:] if prefix != "/compute/" else path)
            return method.id if method else None
    for prefix, api, known in (("/lustre", "lustre", lustre_methods), ("/cq", "cloudquotas", cloudquotas_methods)):
        if path.startswith(prefix + "/"):
            rest = path[len(prefix):]
            if re.fullmatch(r"/v1/projects/[^/]+/locations/[^/]+/operations/[^/]+", rest):
                return f"{api}.projects.locations.operations.get"
            if re.fullmatch(r"/v1/projects/[^/]+/locations", rest):
                return f"{api}.projects.locations.list"
            rpc = next((m.name for m in known() if m.http_method == http_method and m.pattern.fullmatch(rest)), None)
            return f"{api}.projects.locations.{_RPC_IDS[rpc]}" if rpc in _RPC_IDS else None
    return None


def _check_discovery(name: str, http_method: str, path: str, query: dict, body) -> None:
    doc = document(name)
    method = _discovery_method(name, http_method, path)
    if method is None:
        raise Violation(f"The requested URL {http_method} {path} was not found on this server: it matches no method "
                        f"of {name} (discovery revision {doc['revision']}).", 404)
    for key, value in query.items():
        parameter = method.query.get(key) or doc["parameters"].get(key.lstrip("$")) or doc["parameters"].get(key)
        if parameter is None:
            raise Violation(f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. '
                            f"Field '{key}' could not be found in request message.")
        if key.lstrip("$") == "alt":  # "json;enum-encoding=int": enums in the body as their numbers
            value = value.split(";", 1)[0]
        if "enum" in parameter and value not in parameter["enum"]:
            raise Violation(f"Invalid value at '{key}' ({value}): not one of {parameter['enum']}")
    for key, parameter in method.query.items():
        if parameter.get("required") and key not in query:
            raise Violation(f"Required query parameter '{key}' is missing ({method.id}).")
    if method.request is None:
        if body not in (None, {}):
            raise Violation(f"{method.id} takes no request body.")
        return
    # Compute words a body's fields as `resource.name`; the others by the request message's own fields.
    _check_schema(doc, {"$ref": method.request}, body if body is not None else {},
                  "resource" if name == "compute.v1" else "", method.id)


def _check_schema(doc: dict, schema: dict, value, path: str, method_id: str) -> None:
    if "$ref" in schema:
        schema = doc["schemas"][schema["$ref"]]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            raise Violation(f"Invalid value at '{path}': expected an object, got {json.dumps(value)[:60]}")
        properties = schema.get("properties", {})
        for key, child in value.items():
            where = f"{path}.{key}".lstrip(".")
            if key in properties:
                spec = properties[key]
                if spec.get("readOnly") or _OUTPUT_ONLY.match(spec.get("description", "")):
                    raise Violation(f"Invalid value for field '{where}': the field is output only.")
                _check_schema(doc, spec, child, where, method_id)
            elif "additionalProperties" in schema:
                _check_schema(doc, schema["additionalProperties"], child, where, method_id)
            else:
                raise Violation(f'Invalid JSON payload received. Unknown name "{key}" at \'{path}\': '
                                "Cannot find field.")
        for key, spec in properties.items():
            if method_id in spec.get("annotations", {}).get("required", []) and key not in value:
                raise Violation(f"Required field '{f'{path}.{key}'.lstrip('.')}' not specified ({method_id}).")
        return
    if kind == "array":
        if not isinstance(value, list):
            raise Violation(f"Invalid value at '{path}': expected a list, got {json.dumps(value)[:60]}")
        for index, item in enumerate(value):
            _check_schema(doc, schema.get("items", {}), item, f"{path}[{index}]", method_id)
        return
    _check_scalar(schema, value, path)


def _check_scalar(schema: dict, value, path: str) -> None:
    kind, form = schema.get("type"), schema.get("format")
    if kind == "boolean" and not isinstance(value, bool):
        raise Violation(f"Invalid value at '{path}' (TYPE_BOOL), {json.dumps(value)}")
    if kind == "integer" or form in _INTEGER_FORMATS:
        digits = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
        if not re.fullmatch(r"-?[0-9]+", digits) or (form and form.startswith("u") and digits.startswith("-")):
            raise Violation(f"Invalid value at '{path}' (TYPE_{(form or 'int32').upper()}), {json.dumps(value)}")
        return
    if kind == "number" and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise Violation(f"Invalid value at '{path}' (TYPE_DOUBLE), {json.dumps(value)}")
    if "enum" in schema and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return  # the proto3 JSON mapping takes an enum's number too (GAPIC REST asks for that: enum-encoding=int)
    if kind == "string":
        if not isinstance(value, str):
            raise Violation(f"Invalid value at '{path}' (TYPE_STRING), {json.dumps(value)}")
        if "enum" in schema and value not in schema["enum"]:
            raise Violation(f"Invalid value at '{path}' ({value}): must be one of {', '.join(schema['enum'])}")
        if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
            raise Violation(f"Invalid value for field '{path}': '{value}'. Must match regular expression "
                            f"'{schema['pattern']}'.")


# -- Managed Lustre and Cloud Quotas, from their GAPIC libraries' REST transports and protos ------------

@dataclass(frozen=True)
class ProtoMethod:
    name: str
    http_method: str
    pattern: re.Pattern
    request: type          # the proto-plus request message
    body: str | None       # "*", a field of the request, or None


def _proto_methods(types, transport: type) -> tuple[ProtoMethod, ...]:
    found = []
    for attribute in dir(transport):
        if not attribute.startswith("_Base"):
            continue
        rpc = attribute[len("_Base"):]
        request = getattr(types, f"{rpc}Request", None)
        holder = getattr(transport, attribute)
        if request is None or not hasattr(holder, "_get_http_options"):
            continue
        for option in holder._get_http_options():
            pattern = re.sub(r"\{[^=}]+=([^}]+)\}", lambda m: m[1], option["uri"])
            pattern = re.escape(pattern).replace(r"\*\*", ".+").replace(r"\*", r"[^/:]+")
            found.append(ProtoMethod(rpc, option["method"].upper(), re.compile(pattern), request, option.get("body")))
    return tuple(found)


@cache
def lustre_methods() -> tuple[ProtoMethod, ...]:
    from google.cloud.lustre_v1 import types
    from google.cloud.lustre_v1.services.lustre.transports import rest_base

    return _proto_methods(types, rest_base._BaseLustreRestTransport)


@cache
def cloudquotas_methods() -> tuple[ProtoMethod, ...]:
    from google.cloud.cloudquotas_v1 import types
    from google.cloud.cloudquotas_v1.services.cloud_quotas.transports import rest_base

    return _proto_methods(types, rest_base._BaseCloudQuotasRestTransport)


def _check_lustre(http_method: str, path: str, query: dict, body) -> None:
    if http_method == "GET" and re.fullmatch(r"/v1/projects/[^/]+/locations/[^/]+/operations/[^/]+", path):
        return  # google.longrunning.Operations.GetOperation, the mixin every LRO poll uses
    if http_method == "GET" and re.fullmatch(r"/v1/projects/[^/]+/locations", path):
        # google.cloud.location.Locations.ListLocations, the mixin (rest_base.py _BaseListLocations:
        # GET /v1/{name=projects/*}/locations), whose request has filter, pageSize and pageToken
        unknown = set(query) - {"filter", "pageSize", "pageToken", "$alt", "alt"}
        if unknown:
            raise Violation(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}": Cannot bind query '
                            "parameter.")
        return
    _check_gapic(lustre_methods(), "google.cloud.lustre.v1.Lustre", http_method, path, query, body)


def _check_gapic(methods: tuple[ProtoMethod, ...], service: str, http_method: str, path: str, query: dict,
                 body) -> None:
    from google.protobuf import json_format

    matches = [m for m in methods if m.http_method == http_method and m.pattern.fullmatch(path)]
    if not matches:
        raise Violation(f"The requested URL {http_method} {path} was not found on this server: it matches no method "
                        f"of {service}.", 404)
    method = matches[0]
    fields = {f.json_name: f for f in method.request.pb().DESCRIPTOR.fields}
    for key in query:
        if key.lstrip("$") in ("alt", "fields", "prettyPrint", "quotaUser", "key"):
            continue
        if key not in fields or (method.body == "*"):
            raise Violation(f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. '
                            f"Field '{key}' could not be found in request message.")
    if method.body in (None, ""):
        if body not in (None, {}):
            raise Violation(f"{method.name} takes no request body.")
        return
    if method.body == "*":
        message_type, content = method.request, body or {}
    else:
        field = next(f for f in method.request.pb().DESCRIPTOR.fields if f.name == method.body)
        message_type, content = _proto_plus(method.request, field.name), body or {}
    try:
        json_format.ParseDict(content, message_type.pb()())
    except json_format.ParseError as error:
        raise Violation(f"Invalid JSON payload received. {error}") from None
    behaviours = field_behaviours(message_type)
    for key in content:
        if "Output only" in behaviours.get(key, ()):
            raise Violation(f"Invalid value for field '{method.body}.{key}': the field is output only.")
    if method.name.startswith("Create"):
        for key, said in behaviours.items():
            if "Required" in said and key not in content and key != "name":
                raise Violation(f"Required field '{method.body}.{key}' not specified.")


def _proto_plus(request: type, field_name: str) -> type:
    return type(getattr(request(), field_name))


@cache
def field_behaviours(message: type) -> dict[str, tuple[str, ...]]:
    """json name -> behaviours ("Required", "Output only", "Immutable", "Optional") as the generated message's
    attribute docs state them (the GAPIC generator writes google.api.field_behavior there)."""
    doc = textwrap.dedent((message.__doc__ or "").split("Attributes:", 1)[-1].strip("\n"))
    json_names = {f.name: f.json_name for f in message.pb().DESCRIPTOR.fields}
    said: dict[str, tuple[str, ...]] = {}
    for match in re.finditer(r"^(\w+) \([^)]*\):\n\s+((?:(?:Required|Output only|Immutable|Optional)\.\s*)*)",
                             doc, re.MULTILINE):
        if match[1] in json_names:
            said[json_names[match[1]]] = tuple(re.findall(r"(Required|Output only|Immutable|Optional)\.", match[2]))
    return said
