"""Every subcommand's `--help`: what it does (its one-line help, then any description of its own) and examples.

The examples are here, in one table, so that a test can hold every command to having one.
"""

import argparse
import textwrap

EXAMPLES = {
    "validate": ["rlops validate", "rlops validate environments/h200.yaml --describe",
                 "rlops validate environments/b200-spot.yaml --tag v0.7.0"],
    "schema": ["rlops schema > environments/schema.json"],
    "environments": ["rlops environments", "rlops environments --format json"],
    "plan": ["rlops plan h200", "rlops plan h200 --offline --base origin/main --format markdown"],
    "apply": ["rlops apply h200 --dry-run --offline", "rlops apply h200"],
    "doctor": ["rlops doctor h200", "rlops doctor h200 --as plan-live --format markdown"],
    "bootstrap": ["rlops bootstrap my-project --dry-run", "rlops bootstrap my-project --region us-east4 --apply"],
    "iam": ["rlops iam", "rlops iam h200 --format markdown"],
    "destroy": ["rlops destroy h200"],
    "render": ["rlops render h200 --offline"],
    "unlock": ["rlops unlock h200 --force"],
    "up": ["rlops up local"],
    "down": ["rlops down local"],
    "train": ["rlops train local --recipe tiny-arith --run first --set max_steps=20",
              "rlops train h200 --recipe gemma3-27b-gsm8k --run x --dry-run --check-data gsm8k.jsonl"],
    "watch": ["rlops watch local"],
    "snapshot": ["rlops snapshot local"],
    "reap": ["rlops reap h200 --dry-run"],
    "cost": ["rlops cost local", "rlops cost h200 --since 2026-12-01 --format markdown"],
    "status": ["rlops status local", "rlops status local --run first --follow", "rlops status local --format json"],
    "logs": ["rlops logs local first", "rlops logs local first --follow"],
    "cancel": ["rlops cancel local first"],
    "report": ["rlops report local first", "rlops report local first second --output reports/first-vs-second"],
    "checkpoints": ["rlops checkpoints list local first", "rlops checkpoints export local first --step 4"],
    "checkpoints list": ["rlops checkpoints list local first"],
    "checkpoints manifest": [
        "rlops checkpoints manifest .rlops/local/lustre/checkpoints/tiny-arith/first/checkpoint-4"],
    "checkpoints export": ["rlops checkpoints export local first --step 4",
                           "rlops checkpoints export h200 first --to gs://my-bucket/exports"],
    "checkpoints import": ["rlops checkpoints import zone-b first --recipe tiny-arith "
                           "--from gs://rlops-local-state/rlops/environments/local/runs/first/exports/step-4"],
    "checkpoints verify": ["rlops checkpoints verify PATH MANIFEST.json"],
    "changed": ["rlops changed --since HEAD~1 --gcp-only", "rlops changed --since HEAD~1 --until HEAD --unapplied"],
    "github": ["rlops github comment --repo acme/envs --pr 12 --file plan.md"],
    "github comment": ["rlops github comment --repo acme/envs --pr 12 --file plan.md"],
    "github fetch": ["rlops github fetch", "rlops github fetch main"],
    "github has-label": ["rlops github has-label --repo acme/envs --pr 12 --label rlops-destroy"],
}


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every subcommand under `parser`, nested ones as "checkpoints list": (its parser, its one-line help)."""
    found = {}
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found[prefix + name] = (sub, helps.get(name, ""))
                found |= subcommands(sub, prefix + name + " ")
    return found


def document(parser: argparse.ArgumentParser) -> None:
    """Give each subcommand its help line as the start of its description, and its examples as the epilog."""
    for name, (sub, line) in subcommands(parser).items():
        said = line[:1].upper() + line[1:] + ("." if line and not line.endswith(".") else "")
        sub.description = "\n\n".join(textwrap.fill(text, 100) for text in (said, sub.description or "") if text)
        sub.epilog = "examples:\n" + "\n".join(f"  {example}" for example in EXAMPLES.get(name, ()))
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
