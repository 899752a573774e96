"""Reading a spec file into plain data, remembering where in the file every value stood.

PyYAML's composer gives nodes with line and column marks; walking them ourselves lets us refuse
what `yaml.safe_load` silently accepts (duplicate keys, several documents, merge keys) and bound
what it would let explode (alias bombs, deep nesting, huge files).
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlops.spec.inline_secrets import secret_kind

MAX_BYTES = 1 << 20
MAX_NODES = 100_000
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_+-]+$")

SpecPath = tuple  # a path into the document: mapping keys and sequence indexes
Finding = tuple[SpecPath, str]  # what a rule says: the path of the field that is wrong, and what would be right


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, where it is, and what would be right."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        message = " ".join(self.message.split())  # one problem, one line, whatever the parser said
        return f"{self.file}:{self.line}:{self.column}: {self.path or '(document)'}: {message}"


@dataclass
class Document:
    """A spec's data, and for every path the (line, column) of its value and of its key."""

    file: str
    data: Any = None
    value_marks: dict[SpecPath, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[SpecPath, tuple[int, int]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def mark(self, path: SpecPath, prefer_key: bool = False) -> tuple[int, int]:
        """The position of `path`, or of its nearest ancestor that is in the file."""
        while True:
            marks = (self.key_marks, self.value_marks) if prefer_key else (self.value_marks, self.key_marks)
            for table in marks:
                if path in table:
                    return table[path]
            if not path:
                return (1, 1)
            path, prefer_key = path[:-1], True

    def problem(self, path: SpecPath, message: str, prefer_key: bool = False) -> Problem:
        line, column = self.mark(path, prefer_key)
        return Problem(self.file, line, column, format_path(path), message)


def format_path(path: SpecPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, str) and secret_kind(part):
            text += "[<redacted>]"
        elif isinstance(part, int):
            text += f"[{part}]"
        elif not _PLAIN_KEY.match(str(part)):
            # JSON-quoted, and with no ':' left so that "FILE:LINE:COL: PATH: MESSAGE" stays parseable.
            quoted = json.dumps(str(part)).replace(":", "\\u003a")
            text += f"[{quoted}]"
        else:
            text += f".{part}" if text else str(part)
    return text


_PLAIN_COLLECTION_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


class _Walker:
    def __init__(self, doc: Document):
        self.doc = doc
        self.constructor = yaml.constructor.SafeConstructor()
        self.nodes = 0

    def _at(self, node: yaml.Node) -> tuple[int, int]:
        return node.start_mark.line + 1, node.start_mark.column + 1

    def _fail(self, node: yaml.Node, path: SpecPath, message: str) -> None:
        line, column = self._at(node)
        self.doc.problems.append(Problem(self.doc.file, line, column, format_path(path), message))

    def walk(self, node: yaml.Node, path: SpecPath, ancestors: frozenset) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooLarge(node)
        if id(node) in ancestors:
            self._fail(node, path, "an alias refers to its own ancestor; a spec cannot be recursive")
            return None
        self.doc.value_marks[path] = self._at(node)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_COLLECTION_TAGS:
            self._fail(node, path,
                       f"the tag {node.tag} is not allowed; use plain YAML mappings and lists, without tags")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, ancestors | {id(node)})
        if isinstance(node, yaml.SequenceNode):
            return [self.walk(item, path + (i,), ancestors | {id(node)}) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node: yaml.Node, path: SpecPath) -> Any:
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as error:
            self._fail(node, path, f"{error.problem}; use plain YAML values (strings, numbers, booleans)")
            return None

    def _mapping(self, node: yaml.MappingNode, path: SpecPath, ancestors: frozenset) -> dict:
        result: dict = {}
        first_seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                self._fail(key_node, path, "merge keys (<<) are not supported; write the keys out")
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self._fail(key_node, path, "a key must be a plain string, not a mapping or a list")
                continue
            key = self._scalar(key_node, path)
            if not isinstance(key, str):
                # YAML reads `1:` or `on:` as a number or boolean; specs only have string keys.
                key = key_node.value
            if key in first_seen:
                self._fail(key_node, path + (key,), f"duplicate key (first at line {first_seen[key]}); keep one")
                continue
            first_seen[key] = key_node.start_mark.line + 1
            self.doc.key_marks[path + (key,)] = self._at(key_node)
            result[key] = self.walk(value_node, path + (key,), ancestors)
        return result


class _TooLarge(Exception):
    def __init__(self, node: yaml.Node):
        self.node = node


def _decode(raw: bytes, doc: Document) -> str | None:
    if b"\x00" in raw:
        offset = raw.index(b"\x00")
        line = raw.count(b"\n", 0, offset) + 1
        doc.problems.append(Problem(doc.file, line, offset - (raw.rfind(b"\n", 0, offset) + 1) + 1, "",
                                    "binary data (a NUL byte); a spec is a UTF-8 YAML text file"))
        return None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        doc.problems.append(Problem(doc.file, line, column, "",
                                    f"not UTF-8 (byte 0x{raw[error.start]:02x}); save the file as UTF-8"))
        return None


def _yaml_error_message(error: yaml.MarkedYAMLError) -> str:
    message = " ".join(part for part in (error.context, error.problem) if part)
    if "'\\t'" in message:
        return f"{message}; indent with spaces, not tabs"
    return f"{message}; the file is not valid YAML here"


def read_document(path: Path, display_name: str | None = None) -> Document:
    """Read `path` into a Document; problems with the file itself end up in `doc.problems`."""
    doc = Document(file=display_name or str(path))
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            doc.problems.append(Problem(doc.file, 1, 1, "",
                                        f"file is {size} bytes; a spec is at most {MAX_BYTES} bytes"))
            return doc
        raw = path.read_bytes()
    except OSError as error:
        doc.problems.append(Problem(doc.file, 1, 1, "", f"cannot read the file: {error.strerror or error}"))
        return doc
    text = _decode(raw, doc)
    if text is None:
        return doc
    return parse_text(text, doc)


def parse_text(text: str, doc: Document) -> Document:
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        doc.problems.append(Problem(doc.file, line, column, "", _yaml_error_message(error)))
        return doc
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
        doc.problems.append(Problem(doc.file, line, column, "",
                                    f"control character U+{error.character:04X} is not allowed in YAML; remove it"))
        return doc
    except (yaml.YAMLError, RecursionError) as error:
        reason = "nesting is too deep" if isinstance(error, RecursionError) else str(error)
        doc.problems.append(Problem(doc.file, 1, 1, "", f"cannot parse the YAML: {reason}"))
        return doc
    # `---` alone, or `~`, composes to a null document: as empty as an empty file.
    nodes = [node for node in nodes if node is not None and node.tag != "tag:yaml.org,2002:null"]
    if not nodes:
        doc.problems.append(Problem(doc.file, 1, 1, "",
                                    "the file is empty; a spec is a mapping that starts with `provider: gcp` or "
                                    "`provider: local`"))
        return doc
    if len(nodes) > 1:
        line = nodes[1].start_mark.line + 1
        doc.problems.append(Problem(doc.file, line, 1, "",
                                    "a second YAML document; one spec per file, remove the extra `---`"))
        return doc
    root = nodes[0]
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
        doc.problems.append(Problem(doc.file, root.start_mark.line + 1, root.start_mark.column + 1, "",
                                    f"the top level is {kind}; a spec is a mapping of keys such as provider, state, "
                                    "recipes"))
        return doc
    walker = _Walker(doc)
    try:
        doc.data = walker.walk(root, (), frozenset())
    except _TooLarge as error:
        doc.problems.append(Problem(doc.file, error.node.start_mark.line + 1, error.node.start_mark.column + 1, "",
                                    f"more than {MAX_NODES} values (an alias expanding too far?); "
                                    "a spec is far smaller"))
        doc.data = None
    except RecursionError:
        doc.problems.append(Problem(doc.file, 1, 1, "", "nesting is too deep; a spec is a few levels deep"))
        doc.data = None
    return doc
