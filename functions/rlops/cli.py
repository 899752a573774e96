"""The `rlops` command line.

Exit codes: 0 success; 1 an error (including a bad flag); 2 "not clean": `validate` found
problems in a spec.
"""

import argparse
import json
import sys
from pathlib import Path

from rlops import environments

EXIT_OK, EXIT_ERROR, EXIT_INVALID = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2, which `validate` and `plan` give a meaning of their own
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _validate(args: argparse.Namespace) -> int:
    from rlops.spec.describe import describe
    from rlops.spec.load import load

    files = [Path(f) for f in args.files] or environments.spec_files()
    if not files:
        print(f"rlops validate: no *.yaml files in {environments.directory()}", file=sys.stderr)
        return EXIT_ERROR
    problems = 0
    for path in files:
        loaded = load(path)
        for problem in loaded.problems:
            print(problem)
        problems += len(loaded.problems)
        if loaded.environment is not None:
            print(f"{loaded.file}: ok")
            if args.describe:
                print("\n".join(describe(loaded.name, loaded.environment)))
    if problems:
        print(f"{problems} problem(s) in {len(files)} file(s)", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _schema(args: argparse.Namespace) -> int:
    from rlops.spec.load import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlops", description="GitOps for GRPO post-training on GKE.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    validate = commands.add_parser("validate", help="check environment specs; exit 2 when any has a problem")
    validate.add_argument("files", nargs="*", help="spec files (default: every environments/*.yaml)")
    validate.add_argument("--describe", action="store_true", help="also say what each valid spec describes")
    validate.set_defaults(run=_validate)

    schema = commands.add_parser("schema", help="print the JSON Schema of an environment spec")
    schema.set_defaults(run=_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
