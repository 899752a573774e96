"""Derive, for each supported NeMo RL tag, the config keys its example configs set that no code of the tag reads.

    python tools/vendor_nemo_rl_unread.py /work/.mirror/NVIDIA-NeMo+RL/repo [TAG ...]

(the git directory of a checkout of https://github.com/NVIDIA-NeMo/RL; every tag rlops ships configs of by default)
writes functions/rlops/spec/nemo_rl_configs/TAG/UNREAD.json, which `rlops validate` reads to warn on a recipe's
override of such a key (`spec.nemo_rl_unread.unread_overrides`).

A key A.B.K of a config under examples/ counts as read by no code of the tag when all of these hold:
- its section A.B is typed: following NeMo RL's TypedDicts from the `MasterConfig`s' fields down the path, every
  type the section may have is a TypedDict of the tag (a section typed `dict[str, Any]`, or not typed, is handed to
  code rlops cannot read: vLLM, Megatron, a user's class), and K is a field of none of them;
- the name K occurs in no Python file of the tag outside tests/ and docs/, as a word (in code, a string, or a
  comment: any mention is taken as a possible read);
- no section on the path is handed whole to other code: the object of a `**` unpacking, of `.items()`, `.keys()` or
  `.values()`, or of a `for` loop, named by its key (`cfg["backend"]`, `cfg.get("backend")`) or by a variable of
  the section's name or assigned from it (`backend_kwargs = automodel_kwargs.get("backend")`).
So an entry is a key NeMo RL's own code never names and cannot reach by iterating or unpacking its section.
"""

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

CONFIGS = Path(__file__).resolve().parents[1] / "functions/rlops/spec/nemo_rl_configs"
REPOSITORY = "https://github.com/NVIDIA-NeMo/RL"
OPEN_TYPES = {"dict", "Dict", "Any", "Mapping", "MutableMapping", "DictConfig", "object"}
WHOLE_METHODS = {"items", "keys", "values"}
COPIES = {"deepcopy", "copy", "dict"}  # a copy of a section is the section, handed on
SHOWN_PLACES = 3  # of the configs that set a key, the first few cited


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], capture_output=True, text=True, check=True).stdout


class Code:
    """What the tag's Python says: every word, its TypedDicts (name -> [(fields, bases, where)]), and the names of
    the sections it hands whole to other code."""

    def __init__(self):
        self.words: set[str] = set()
        self.classes: dict[str, list[tuple[dict[str, set[str]], list[str], str]]] = defaultdict(list)
        self.whole: set[str] = set()

    def read(self, path: str, text: str) -> None:
        self.words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_-]*", text))
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        assigned: dict[str, set[str]] = defaultdict(set)  # variable -> the section names it was assigned from
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = {statement.target.id: _type_names(statement.annotation) for statement in node.body
                          if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)}
                bases = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases]
                self.classes[node.name].append((fields, bases, f"{path}:{node.lineno}"))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned[node.targets[0].id] |= _section_names(node.value)
        handed = []
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg is None:
                handed.append(node.value)
            elif isinstance(node, ast.Dict):
                handed += [value for key, value in zip(node.keys, node.values, strict=True) if key is None]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in WHOLE_METHODS):
                handed.append(node.func.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                handed.append(node.iter)
        for expression in handed:
            names = _section_names(expression)
            self.whole |= names | {section for name in names for section in assigned.get(name, ())}

    def typed_dicts(self) -> set[str]:
        def typed(name: str, seen: frozenset = frozenset()) -> bool:
            return any("TypedDict" in bases or any(base in self.classes and base not in seen
                                                   and typed(base, seen | {name}) for base in bases)
                       for _, bases, _ in self.classes.get(name, []))
        return {name for name in self.classes if typed(name)}


def _type_names(annotation: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # a forward reference
            names |= set(re.findall(r"[A-Za-z_]\w*", node.value))
    return names


def _section_names(expression: ast.AST) -> set[str]:
    """The section an expression stands for: the last key of a subscript or .get() chain, a variable's or
    attribute's name; through a copy of it."""
    if isinstance(expression, ast.Subscript) and isinstance(expression.slice, ast.Constant):
        return {str(expression.slice.value)}
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute):
        if expression.func.attr == "get" and expression.args and isinstance(expression.args[0], ast.Constant):
            return {str(expression.args[0].value)}
        if expression.func.attr in COPIES and expression.args:
            return _section_names(expression.args[0])
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name) and expression.func.id in COPIES \
            and expression.args:
        return _section_names(expression.args[0])
    if isinstance(expression, ast.BoolOp):  # cfg.get("x") or {}
        return set().union(*(_section_names(value) for value in expression.values))
    if isinstance(expression, ast.Name):
        return {expression.id}
    if isinstance(expression, ast.Attribute):
        return {expression.attr}
    return set()


def config_keys(text: str, path: str, found: dict[str, list[str]]) -> None:
    """Every key path of a YAML config, with where it is set (path:line)."""
    def walk(node, prefix: str):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: the anchor's keys are this mapping's
                    for merged in value.value if isinstance(value, yaml.SequenceNode) else [value]:
                        walk(merged, prefix)
                    continue
                dotted = f"{prefix}.{key.value}" if prefix else str(key.value)
                place = f"{path}:{key.start_mark.line + 1}"
                if place not in found[dotted]:  # an anchor merged twice is set once
                    found[dotted].append(place)
                walk(value, dotted)
    try:
        walk(yaml.compose(text, Loader=yaml.SafeLoader), "")
    except yaml.YAMLError as error:
        print(f"{path}: not read ({str(error).splitlines()[0]})", file=sys.stderr)


def unread(git_dir: str, tag: str) -> dict:
    files = git(git_dir, "ls-tree", "-r", "--name-only", tag).splitlines()
    code = Code()
    for path in files:
        if path.endswith(".py") and not path.startswith(("tests/", "docs/")):
            code.read(path, git(git_dir, "show", f"{tag}:{path}"))
    keys: dict[str, list[str]] = defaultdict(list)
    for path in files:
        if path.startswith("examples/") and path.endswith(".yaml"):
            config_keys(git(git_dir, "show", f"{tag}:{path}"), path, keys)
    typed = code.typed_dicts()

    def fields(name: str) -> dict[str, set[str]]:
        merged: dict[str, set[str]] = {}
        for own, bases, _ in code.classes[name]:
            for base in bases:
                if base in typed:
                    merged.update(fields(base))
            merged.update(own)
        return merged

    def types(names: set[str]) -> set[str] | None:
        return None if names & OPEN_TYPES else {name for name in names if name in typed}

    sections: dict[str, set[str] | None] = {}
    for own, _, _ in code.classes.get("MasterConfig", []):
        for key, names in own.items():
            kinds = types(names)
            sections[key] = (None if kinds is None or sections.get(key, set()) is None
                             else sections.get(key, set()) | kinds)

    def section_types(path: str) -> set[str] | None:
        if path not in sections:
            parent, _, name = path.rpartition(".")
            outer = section_types(parent) if parent else None
            kinds: set[str] | None = set() if outer else None
            for kind in outer or ():
                own = fields(kind)
                inner = types(own[name]) if name in own else set()
                kinds = None if inner is None or kinds is None else kinds | inner
            sections[path] = kinds or None
        return sections[path]

    found = {}
    for path in sorted(keys):
        parent, _, name = path.rpartition(".")
        kinds = section_types(parent) if parent else None
        if not kinds or name in code.words or any(name in fields(kind) for kind in kinds):
            continue
        if set(parent.split(".")) & code.whole:
            continue
        found[path] = {"section": [f"{kind} ({place})" for kind in sorted(kinds)
                                   for _, _, place in code.classes[kind]],
                       "set_in": keys[path][:SHOWN_PLACES], "configs": len(keys[path])}
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    git_dir, tags = argv[0], argv[1:] or sorted(path.parent.name for path in CONFIGS.glob("v*/SOURCE.json"))
    for tag in tags:
        commit = git(git_dir, "rev-parse", f"{tag}^{{commit}}").strip()
        shipped = json.loads((CONFIGS / tag / "SOURCE.json").read_text())["commit"]
        if commit != shipped:
            raise SystemExit(f"{tag}: the checkout's commit {commit} is not the shipped configs' {shipped}")
        table = {"repository": REPOSITORY, "tag": tag, "commit": commit, "derived_by": "tools/vendor_nemo_rl_unread.py",
                 "rule": "a key of an examples/ config whose section is a TypedDict without it, whose name no Python "
                         "file outside tests/ and docs/ mentions, under no section handed whole to other code",
                 "keys": unread(git_dir, tag)}
        (CONFIGS / tag / "UNREAD.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"{tag} ({commit[:12]}): {', '.join(table['keys']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
