"""Files that are not YAML specs at all: each gets one clean problem, never a traceback."""

import pytest

from rlops import cli


def _validate(path, capsys):
    code = cli.main(["validate", str(path)])
    out = capsys.readouterr().out
    assert code == 2
    assert "Traceback" not in out
    return out.splitlines()


def test_binary_garbage(tmp_path, capsys):
    path = tmp_path / "garbage.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    (line,) = _validate(path, capsys)
    assert line.startswith(f"{path}:1:1: (document): binary data")


def test_not_utf8_names_the_line(tmp_path, capsys):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"provider: local\nstate:\n  bucket: caf\xe9\n")
    (line,) = _validate(path, capsys)
    assert line.startswith(f"{path}:3:")
    assert "not UTF-8" in line


def test_a_50_megabyte_file_is_refused_without_reading_it(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(50 * 1024 * 1024)
    (line,) = _validate(path, capsys)
    assert "at most 1048576 bytes" in line


def test_an_alias_bomb_is_bounded(tmp_path, capsys):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("provider: local\n" + "\n".join(levels) + "\n")
    lines = _validate(path, capsys)
    assert any("more than 100000 values" in line for line in lines)


def test_deep_nesting_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("provider: local\nstate: " + "[" * 5000 + "]" * 5000 + "\n")
    lines = _validate(path, capsys)
    assert len(lines) >= 1


def test_a_missing_file(tmp_path, capsys):
    (line,) = _validate(tmp_path / "nowhere.yaml", capsys)
    assert "cannot read the file" in line


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_files(tmp_path, capsys, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    (line,) = _validate(path, capsys)
    assert "the file is empty" in line


def test_all_problems_of_a_file_are_reported_at_once(tmp_path, capsys, environments_dir):
    text = (environments_dir / "h200.yaml").read_text()
    broken = (text.replace("capacity_gib: 18000", "capacity_gib: 18001")
              .replace("zone: us-central1-b", "zone: europe-west4-a")
              .replace('ray_version: "2.49.2"', 'ray_version: "2.54.0"'))
    path = tmp_path / "h200.yaml"
    path.write_text(broken)
    paths = {line.split(": ")[1] for line in _validate(path, capsys)}
    assert paths == {"zone", "lustre.capacity_gib", "ray.ray_version"}
