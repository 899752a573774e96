"""Issue 39, 3: what every command shares — a help with its description and examples that parse, a subcommand's
own usage on a bad flag, did-you-mean for environments and runs, and specs found from the repository's root."""

import json
import shlex
import shutil

import pytest

from conftest import ENVIRONMENTS
from rlops import cli
from rlops.cli import helptext


def test_every_subcommands_help_says_what_it_does_and_gives_examples_that_parse(capsys):
    parser = cli.build_parser()
    commands = helptext.subcommands(parser)
    assert {"status", "cancel", "logs", "checkpoints list", "github comment"} <= set(commands)
    assert set(helptext.EXAMPLES) == set(commands), "every command has examples, and no example names a gone one"
    for name, (sub, line) in commands.items():
        text = sub.format_help()
        assert line and line[1:] in " ".join(text.split()), (name, text)
        examples = text.split("examples:\n", 1)[1].splitlines()
        assert examples, name
        for example in examples:
            words = shlex.split(example.split(" > ")[0])
            assert words[:1 + name.count(" ") + 1] == ["rlops", *name.split()], (name, example)
            parser.parse_args(words[1:])  # exits (SystemExit) on an example that no longer parses


def test_an_unknown_flag_gets_the_subcommands_usage_not_the_top_levels(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "local", "--bogus"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert err.startswith("usage: rlops status ") and "rlops status: error: unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):
        cli.main(["checkpoints", "list", "local", "first", "--step", "3"])
    assert capsys.readouterr().err.startswith("usage: rlops checkpoints list ")


def test_a_mistyped_environment_is_named_with_the_closest_one(capsys):
    assert cli.main(["status", "locl"]) == 1
    assert capsys.readouterr().err == ("rlops status: no spec for environment 'locl': environments/locl.yaml does not "
                                       "exist (did you mean 'local'?)\n")
    assert cli.main(["render", "zzz", "--offline"]) == 1
    assert "did you mean" not in capsys.readouterr().err


def test_specs_are_found_from_any_directory_of_the_repository(tmp_path, monkeypatch, capsys):
    """As git finds its work tree: `rlops environments` and `rlops validate` in a subdirectory act on the
    repository's environments/, and the local stack's state and reports are placed from the same root."""
    from rlops import environments
    from rlops.local import stack

    repo = tmp_path / "envs-repo"
    shutil.copytree(ENVIRONMENTS, repo / "environments")
    (repo / "docs" / "deep").mkdir(parents=True)
    monkeypatch.delenv("RLOPS_ENVIRONMENTS", raising=False)
    monkeypatch.delenv("RLOPS_LOCAL_DIR", raising=False)
    monkeypatch.chdir(repo / "docs" / "deep")
    assert cli.main(["environments", "--format", "json"]) == 0
    listed = capsys.readouterr().out
    assert '"local"' in listed and '"h200"' in listed
    assert cli.main(["validate"]) == 0
    assert environments.directory() == repo / "environments"
    assert stack.state_directory("local") == repo / ".rlops" / "local"
    monkeypatch.chdir(tmp_path)  # outside any repository: the current directory, as before
    assert environments.directory().resolve() == (tmp_path / "environments").resolve()


@pytest.mark.parametrize("chosen, said", [("text", "warning: pool busy (run=r1 attempt=2)\n"),
                                          ("json", '{"severity": "WARNING", "message": "pool busy", "run": "r1", '
                                                   '"attempt": 2}\n'),
                                          ("auto", '{"severity": "WARNING", "message": "pool busy", "run": "r1", '
                                                   '"attempt": 2}\n')])  # auto: stderr is no terminal here
def test_log_lines_are_text_for_a_person_and_json_for_a_program(chosen, said, capsys, monkeypatch):
    from rlops import logs

    for kept in ("_to_stderr", "_as_text"):
        monkeypatch.setattr(logs, kept, getattr(logs, kept))  # restored after: other tests read JSON lines
    assert cli.build_parser().parse_args(["--log-format", chosen, "status", "local"]).log_format == chosen
    logs.to_stderr(chosen)
    logs.emit("WARNING", "pool busy", run="r1", attempt=2)
    assert capsys.readouterr() == ("", said)


def test_validate_reports_each_file_as_json(capsys):
    assert cli.main(["validate", "--format", "json", str(ENVIRONMENTS / "local.yaml"),
                     str(ENVIRONMENTS.parent / "tests" / "broken" / "accelerator-count-four.yaml")]) == 2
    said = json.loads(capsys.readouterr().out)
    assert [(f["environment"], f["ok"]) for f in said["files"]] == [("local", True), ("accelerator-count-four", False)]
    assert said["problems"] == len(said["files"][1]["problems"]) > 0
    assert {"file", "line", "column", "path", "message"} == set(said["files"][1]["problems"][0])


@pytest.mark.parametrize("verb, instead", [("up", "rlops apply h200"), ("down", "rlops destroy h200")])
def test_up_and_down_on_a_gcp_environment_name_the_command_that_does_it(verb, instead, capsys):
    assert cli.main([verb, "h200"]) == 1
    assert capsys.readouterr().err.endswith(f"is for local ones (use `{instead}`)\n")
