"""Each file in tests/broken/ breaks one rule: rlops must name that field, on the line marked `# <-- error`.

Line 1 of a file is `# expect: FIELD.PATH`; where no line can carry the marker (an empty file, the
file name), line 2 is `# expect-line: N`.
"""

from pathlib import Path

import pytest

from rlops import cli
from rlops.spec import inline_secrets

BROKEN = Path(__file__).resolve().parent.parent / "broken"
FILES = sorted(BROKEN.glob("*.yaml"))
MARKER = "# <-- error"


def expectation(path: Path) -> tuple[str, int]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# expect: ")
    field = lines[0].removeprefix("# expect: ")
    if len(lines) > 1 and lines[1].startswith("# expect-line: "):
        assert not any(MARKER in text for text in lines)
        return field, int(lines[1].removeprefix("# expect-line: "))
    (line,) = [number for number, text in enumerate(lines, 1) if MARKER in text]
    return field, line


def parse(printed: str, path: Path) -> tuple[int, str, str]:
    """`FILE:LINE:COL: PATH: MESSAGE` -> (LINE, PATH, MESSAGE)."""
    assert printed.startswith(f"{path}:"), printed
    position, field, message = printed.removeprefix(f"{path}:").split(": ", 2)
    return int(position.split(":")[0]), field, message


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_broken_spec_is_reported_at_its_field_and_line(path, capsys):
    field, line = expectation(path)
    code = cli.main(["validate", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in captured.out + captured.err
    problems = [parse(printed, path) for printed in captured.out.splitlines()]
    assert all("; " in message for _, _, message in problems), captured.out
    assert inline_secrets.secret_kind(captured.out + captured.err) is None, "a report echoed a secret"
    assert (line, field) in {(at, name) for at, name, _ in problems}, captured.out


def test_the_corpus_covers_many_rules():
    assert len(FILES) >= 45
    assert len({expectation(path)[0] for path in FILES}) >= 35
