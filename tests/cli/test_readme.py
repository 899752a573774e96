"""Issue 39, 6: the README a newcomer reads first, and the docs/ it links, say what the code does. Each figure that
can drift is read here from where the code keeps it and looked for in the text; every command the text names is
one the CLI has, and every command line in its shell blocks parses."""

import inspect
import re
import shlex

import pytest
import yaml

from conftest import REPO
from rlops import cli
from rlops.cli import helptext
from rlops.local import stack
from rlops.provision import accounts, bootstrap
from rlops.spec import model
from rlops.state.lock import Lock

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))


def text(path) -> str:
    return path.read_text()


def seconds(duration: str) -> int:
    """`30s`, `30m`, `10800s` as the specs and Cloud Build write them."""
    number, unit = re.fullmatch(r"(\d+)([smhd])", duration).groups()
    return int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def said(path, phrase: str) -> None:
    """`phrase`, with any run of whitespace (a wrapped line) matching any other."""
    pattern = r"\s+".join(map(re.escape, phrase.split()))
    assert re.search(pattern, text(path)), f"{path.relative_to(REPO)} does not say {phrase!r}"


def test_the_first_screen_is_at_most_60_lines_and_says_what_you_need():
    lines = text(README).splitlines()
    assert lines[0].startswith("# ")
    end = next(i for i, line in enumerate(lines[1:], 1) if line.startswith("## "))
    first = "\n".join(lines[:end])
    assert end <= 60, f"the first screen is {end} lines"
    for needed in ("Who it is for", "What you need", "2nd-gen", "reservation", "Spot quota", "`python3`", "`gcloud`",
                   "| GPU (`machine_type`) |"):
        assert needed in first, needed


def test_the_local_idle_timeout_is_the_one_local_yaml_sets():
    timeout = yaml.safe_load((REPO / "environments" / "local.yaml").read_text())["idle"]["timeout"]
    for path in (README, REPO / "docs" / "internals.md"):
        said(path, f"`idle.timeout: {timeout}`")
    said(README, f"{seconds(timeout)} s idle timeout")
    said(REPO / "docs" / "spec.md", f"a {seconds(timeout)}-second idle timeout (`idle.timeout: {timeout}`)")
    for path in (README, *DOCS):
        assert not re.search(r"(two|2)[- ]minutes?\W+\(?`?idle", text(path)), path


def test_the_spec_defaults_the_text_names_are_the_models():
    gpu_wait = model.Recipe.model_fields["gpu_wait"].default
    budget = model.Recipe.model_fields["resume_budget"].default
    idle = model.IdlePolicy.model_fields["timeout"].default
    said(README, f"`gpu_wait` (default {gpu_wait})")
    said(REPO / "docs" / "internals.md", f"`gpu_wait` (default {gpu_wait})")
    said(REPO / "docs" / "spec.md", f"gpu_wait (default {gpu_wait})")
    said(README, f"`resume_budget` (default {budget})")
    said(REPO / "docs" / "internals.md", f"`resume_budget` (default {budget} resubmissions")
    said(README, f"`idle.timeout` (default {idle};")


def test_the_apply_pipelines_timeout_and_lock_wait_are_apply_yamls():
    apply = yaml.safe_load((REPO / "cloudbuild" / "apply.yaml").read_text())
    timeout = apply["timeout"]
    said(REPO / "docs" / "gcp-setup.md", f"`timeout: {timeout}`")
    hours = seconds(timeout) / 3600
    assert hours.is_integer()
    said(REPO / "docs" / "gcp-setup.md", f"may run for {int(hours)} hours")
    said(README, f"the build may run for {int(hours)} hours")
    (wait,) = re.findall(r"--lock-timeout (\d+)", (REPO / "cloudbuild" / "apply.yaml").read_text())
    said(README, f"(600 s; the pipeline {wait} s)")
    said(REPO / "docs" / "gcp-setup.md", f"(`--lock-timeout {wait}`)")


def test_the_lock_figures_are_the_cli_and_the_locks():
    parser = cli.build_parser()
    apply, _ = helptext.subcommands(parser)["apply"]
    default = next(a.default for a in apply._actions if a.dest == "lock_timeout")
    said(README, f"`--lock-timeout` ({default:g} s;")
    said(REPO / "docs" / "commands.md", f"default {default:g} s, for another apply")
    ttl = inspect.signature(Lock.__init__).parameters["ttl_seconds"].default
    assert ttl % 60 == 0
    said(README, f"unrefreshed for {ttl // 60} minutes")


def test_the_subscriptions_delivery_figures_are_deploy_yamls():
    deploy = (REPO / "cloudbuild" / "deploy.yaml").read_text()
    low, high = re.search(r"--min-retry-delay=(\d+)s --max-retry-delay=(\d+)s", deploy).groups()
    attempts = yaml.safe_load(deploy)["substitutions"]["_MAX_DELIVERIES"]
    assert "--max-delivery-attempts=$_MAX_DELIVERIES" in deploy
    (kept,) = re.findall(r"subscriptions create rlops-dead-letter .*--message-retention-duration (\d+)d",
                         deploy.replace("\\\n", " "))
    (schedule,) = re.findall(r"--schedule \"([^\"]+)\"", deploy)
    setup = REPO / "docs" / "gcp-setup.md"
    said(setup, f"`--min-retry-delay={low}s --max-retry-delay={high}s`")
    said(setup, f"at most {attempts} delivery attempts")
    said(setup, f"keeps dead letters for {kept} days")
    said(setup, f"(`{schedule}`)")
    said(README, f"at most {attempts} times, {low} s to {high} s apart")
    said(README, f"keeps it for {kept} days")
    assert schedule == "* * * * *"  # "every minute", as the README and gcp-setup.md say
    said(README, "Cloud Scheduler every minute on GCP")


def test_the_local_tick_is_the_stacks(monkeypatch):
    monkeypatch.delenv("RLOPS_LOCAL_TICK_SECONDS", raising=False)
    tick = stack.tick_seconds()
    said(README, f"`reap` every {tick:g} s")
    said(README, f"every {tick:g} s locally")
    said(REPO / "docs" / "internals.md", f"ticks the last three every {tick:g} s")


def test_the_apis_bootstrap_enables_are_the_ones_the_setup_page_lists():
    listed = re.search(r"`gcloud services enable` ([^(]+)\(", text(REPO / "docs" / "gcp-setup.md")).group(1)
    names = {name + ".googleapis.com" for name in re.findall(r"[a-z]+", re.sub(r"\band\b", "", listed))}
    assert names == set(bootstrap.SERVICES)


def test_the_documented_triggers_are_the_ones_bootstrap_makes():
    setup = text(REPO / "docs" / "gcp-setup.md")
    block = setup[setup.index("Repositories → 2nd gen"):]
    block = block[block.index("```sh") + 5:block.index("```", block.index("```sh") + 5)]
    documented = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()
                  if line.strip().startswith("gcloud ")]
    made = [list(step.argv) for step in bootstrap.steps("$PROJECT", "$REGION", repository="$REPOSITORY")
            if step.argv[:4] == ("gcloud", "builds", "triggers", "create")]
    assert sorted(documented) == sorted(made)


def test_the_accounts_bootstrap_makes_are_the_ones_the_readme_and_uninstall_name():
    names = sorted({a.name.split()[0] for a in accounts.ACCOUNTS} | set(bootstrap.FUNCTION_ACCOUNTS))
    uninstall = text(README)[text(README).index("## Uninstall"):]
    quickstart = text(README)[text(README).index("## Quickstart on Google Cloud"):text(README).index("## Concepts")]
    for name in names:
        assert f"`{name}`" in uninstall and f"`{name}`" in quickstart, name
    for secret in bootstrap.SECRETS:
        assert f"`{secret}`" in uninstall, secret


def _named_commands(body: str) -> list[str]:
    """What follows `rlops ` in each code span and each shell line."""
    found = re.findall(r"`rlops ([^`]+)`", body)
    for block in re.findall(r"```(?:sh|console)\n(.*?)```", body, re.S):
        found += [line.strip()[len("rlops "):] for line in block.replace("\\\n", " ").splitlines()
                  if line.strip().startswith("rlops ")]
    return found


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_command_named_is_one_the_cli_has(path):
    commands = helptext.subcommands(cli.build_parser())
    named = _named_commands(text(path))
    assert named
    for words in (shlex.split(line.split("  #")[0]) for line in named):
        if words[0].startswith("-") or words[0].isupper():  # `rlops --version`, `rlops COMMAND --help`
            continue
        assert words[0] in commands, (path.name, words)
        nested = {name.split()[1] for name in commands if name.startswith(words[0] + " ")}
        if nested and len(words) > 1 and re.fullmatch(r"[a-z][a-z-]*", words[1]):
            assert words[1] in nested, (path.name, words)


def test_every_command_line_of_the_readmes_shell_blocks_parses():
    parser = cli.build_parser()
    lines = [line for block in re.findall(r"```sh\n(.*?)```", text(README), re.S)
             for line in block.replace("\\\n", " ").splitlines() if line.strip().startswith("rlops ")]
    assert len(lines) >= 15
    for line in lines:
        words = shlex.split(line.split("  #")[0])
        parser.parse_args(words[1:])  # SystemExit on a command or flag the CLI does not have


def test_no_table_cell_is_longer_than_300_characters_but_rlops_iams_roles():
    generated = set(accounts.render("markdown").splitlines())  # the roles a role list needs, not prose
    for path in (README, *DOCS):
        for number, line in enumerate(text(path).splitlines(), 1):
            if line.lstrip().startswith("|") and line not in generated:
                longest = max(map(len, re.split(r"(?<!\\)\|", line)))
                assert longest <= 300, f"{path.name}:{number}: a cell of {longest} characters"


def _anchors(path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text(path), re.M)}


def test_every_doc_the_readme_links_exists_and_every_doc_is_linked():
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)", text(README)))
    assert linked == {str(path.relative_to(REPO)) for path in DOCS}
    for path in [README, *DOCS]:
        for target, anchor in re.findall(r"\]\(((?:\.\./)?[A-Za-z-]+(?:/[a-z-]+)?\.md)?(?:#([a-z0-9-]+))?\)",
                                         text(path)):
            linked_to = path.parent / target if target else path
            assert linked_to.exists(), (path.name, target)
            assert not anchor or anchor in _anchors(linked_to), (path.name, target, anchor)
