"""Random YAML and mutated copies of the real specs: exit 0, or a clean exit-2 report."""

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlops import cli

pytestmark = pytest.mark.exhaustive

ENVIRONMENTS = Path(__file__).resolve().parent.parent.parent / "environments"
SPEC_TEXTS = [p.read_text() for p in sorted(ENVIRONMENTS.glob("*.yaml"))]
REPORT_LINE = re.compile(r"^.+:\d+:\d+: [^:]+: .+$")
# The same draws on every run, so that CI passes or fails on the code; RLOPS_FUZZ_EXAMPLES=N explores N new ones.
EXPLORE = os.environ.get("RLOPS_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(EXPLORE or 150), deadline=None, derandomize=not EXPLORE,
                suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=30,
)


def _validate_text(text: str) -> None:
    output = io.StringIO()
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(output):
        path = Path(folder) / "fuzzed.yaml"
        path.write_bytes(text.encode("utf-8", errors="replace"))
        code = cli.main(["validate", str(path)])
    out = output.getvalue()
    assert code in (0, 2)
    lines = out.splitlines()
    if code == 0:
        assert lines == [f"{path}: ok"]
    else:
        assert lines and all(REPORT_LINE.match(line) for line in lines), out


@FUZZ
@given(document=documents)
def test_random_yaml_documents(document):
    _validate_text(yaml.safe_dump(document))


@FUZZ
@given(spec=st.sampled_from(SPEC_TEXTS), data=st.data())
def test_text_mutations_of_the_real_specs(spec, data):
    lines = spec.splitlines(keepends=True)
    mutation = data.draw(st.sampled_from(["delete", "duplicate", "insert", "replace-char", "truncate", "swap"]))
    i = data.draw(st.integers(0, len(lines) - 1))
    if mutation == "delete":
        del lines[i]
    elif mutation == "duplicate":
        lines.insert(i, lines[i])
    elif mutation == "insert":
        lines.insert(i, data.draw(st.text(max_size=40)) + "\n")
    elif mutation == "replace-char" and lines[i]:
        j = data.draw(st.integers(0, len(lines[i]) - 1))
        lines[i] = lines[i][:j] + data.draw(st.characters()) + lines[i][j + 1:]
    elif mutation == "truncate":
        lines = lines[:i]
    elif mutation == "swap":
        j = data.draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    _validate_text("".join(lines))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


@FUZZ
@given(spec=st.sampled_from(SPEC_TEXTS), data=st.data())
def test_value_mutations_of_the_real_specs(spec, data):
    document = yaml.safe_load(spec)
    path = data.draw(st.sampled_from([p for p in _paths(document) if p]))
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(documents)
    else:
        del parent[path[-1]]
    _validate_text(yaml.safe_dump(document, sort_keys=False))
