"""The CLI's `checkpoints` commands: list a run's, build and verify a manifest, export and import."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from rlops.cli.common import Commands, Exit, format_option, open_site, print_json, run_name
from rlops.errors import Failure


def _checkpoint_manifest(args: argparse.Namespace) -> int:
    from rlops.checkpoints import manifest

    try:
        print(json.dumps(manifest.build(Path(args.path)), indent=1, sort_keys=True))
    except manifest.ManifestError as error:
        raise Failure(str(error)) from None
    return Exit.OK


def _checkpoint_verify(args: argparse.Namespace) -> int:
    from rlops.checkpoints import manifest

    try:
        differences = manifest.verify(Path(args.path), manifest.load(Path(args.manifest)))
    except manifest.ManifestError as error:
        raise Failure(str(error)) from None
    for kind in ("missing", "extra", "changed"):
        for item in differences[kind]:
            print(f"{kind}: {item}")
    same = not any(differences.values())
    print(f"{args.path}: {'identical to' if same else 'differs from'} {args.manifest}")
    return Exit.OK if same else Exit.ERROR


def _export_checkpoint(args: argparse.Namespace) -> int:
    from rlops.checkpoints.manifest import ManifestError
    from rlops.runs.checkpoint_transfers import export_checkpoint, storage_location
    from rlops.runs.readable import size

    site = open_site(args.environment, args.endpoints)
    destination = storage_location(site, args.to, "--to") if args.to else None
    try:
        done = export_checkpoint(site, args.run_name, args.step, destination, _progress)
    except ManifestError as error:
        raise Failure(str(error)) from None
    print(f"exported step {done['step']} of {args.run_name}: {done['objects']} objects, {size(done['bytes'])}, to "
          f"{done['destination']}")
    print("verified: every object's size and crc32c match the manifest, none missing, none extra")
    return Exit.OK


def _import_checkpoint(args: argparse.Namespace) -> int:
    from rlops.checkpoints.manifest import ManifestError
    from rlops.runs.checkpoint_transfers import import_checkpoint, storage_location
    from rlops.runs.readable import size

    site = open_site(args.environment, args.endpoints)
    recipe = args.recipe or (next(iter(site.env.recipes)) if len(site.env.recipes) == 1 else None)
    if recipe is None:
        raise Failure(f"--recipe: {args.environment} has recipes {', '.join(site.env.recipes)}; say which one the "
                      "run will use (its checkpoint directory is CHECKPOINT_ROOT/RUN)")
    try:
        source = storage_location(site, getattr(args, "from"), "--from")
        done = import_checkpoint(site, args.run_name, recipe, source, _progress)
    except ManifestError as error:
        raise Failure(str(error)) from None
    print(f"imported step {done['step']} into {done['directory']}: {done['objects']} objects, {size(done['bytes'])}; "
          f"{done['verified']}")
    print(f"its manifest is with {args.environment}'s state: `rlops train {args.environment} --recipe {recipe} --run "
          f"{args.run_name}` resumes from it")
    return Exit.OK


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _list_checkpoints(args: argparse.Namespace) -> int:
    from rlops.runs import snapshot
    from rlops.runs.readable import size

    environment, run = args.environment, args.run_name
    site = open_site(environment, args.endpoints)
    rows = snapshot.listing(site, run)
    if rows is None:
        raise Failure(site.records.unknown(run))
    if args.format == "json":
        print_json({"environment": environment, "run": run, "checkpoints": rows})
        return Exit.OK
    header = ("STEP", "SIZE", "SAVED", "VERIFIED", "METRICS")
    lines = [header] + [(str(r["step"]), size(r["total_bytes"]), r["saved"], r["verified"], _metrics(r["metrics"]))
                        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines))
    return Exit.OK


def _metrics(said: str) -> str:
    """A checkpoint's metrics (JSON, as the manifest has them) as `reward=0.4123 loss=0.01235`: rounded for the
    table; `--format json` keeps the numbers whole."""
    from rlops.runs.readable import number

    if said == "-":
        return said
    return " ".join(f"{name}={number(value) if isinstance(value, float) else value}"
                    for name, value in json.loads(said).items())


def add_commands(commands: Commands) -> None:
    checkpoints = commands.add_parser("checkpoints", help="checkpoint manifests: list a run's, build one, verify one")
    verbs = checkpoints.add_subparsers(dest="verb", required=True, metavar="VERB")

    def of_a_run(verb: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        parser = verbs.add_parser(verb, help=help)
        parser.add_argument("environment", metavar="ENV")
        parser.add_argument("run_name", type=run_name, metavar="RUN")
        parser.set_defaults(run=run)
        return parser

    format_option(of_a_run("list", _list_checkpoints,
                           "a run's checkpoints with their manifests and whether they verify"))
    build = verbs.add_parser("manifest", help="print the manifest of the checkpoint at PATH (JSON)")
    build.add_argument("path", metavar="PATH")
    build.set_defaults(run=_checkpoint_manifest)
    export = of_a_run("export", _export_checkpoint, "copy a run's checkpoint to Cloud Storage (GKE: the Lustre "
                                                    "API's exportData) and verify every object against its manifest")
    export.add_argument("--step", type=int, help="default: the newest with a manifest")
    export.add_argument("--to", metavar="gs://BUCKET/PREFIX", help="default: the state bucket, runs/RUN/exports")
    imported = of_a_run("import", _import_checkpoint, "copy a verified export into a run's checkpoint directory "
                                                      "here (GKE: importData), so that the run resumes from it")
    imported.add_argument("--from", required=True, metavar="gs://BUCKET/PREFIX/step-N")
    imported.add_argument("--recipe", help="the recipe the run will use (default: the environment's only one)")
    verify = verbs.add_parser("verify", help="re-hash PATH against MANIFEST and list missing, extra and changed "
                                             "files (exit 0 identical, 1 not)")
    verify.add_argument("path", metavar="PATH")
    verify.add_argument("manifest", metavar="MANIFEST")
    verify.set_defaults(run=_checkpoint_verify)
