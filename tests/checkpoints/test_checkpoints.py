"""Checkpoint manifests of real checkpoints (written by the local recipe) and `verify` catching every change."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import google_crc32c
import pytest

from conftest import REPO
from rlops import cli
from rlops.checkpoints import manifest

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run directory the TRL recipe wrote: checkpoint-2 and checkpoint-4."""
    run = tmp_path_factory.mktemp("ckpt") / "run-a"
    subprocess.run([sys.executable, "-m", "rlops.workloads.trl_grpo", "--output-dir", str(run), "max_steps=4"],
                   check=True, capture_output=True, timeout=300)
    return run


@pytest.fixture
def checkpoint(trained, tmp_path) -> Path:
    copy = tmp_path / "run-a" / "checkpoint-4"
    shutil.copytree(trained / "checkpoint-4", copy)
    return copy


def manifest_of(path: Path, capsys) -> tuple[dict, Path]:
    assert cli.main(["checkpoints", "manifest", str(path)]) == 0
    content = json.loads(capsys.readouterr().out)
    written = path.parent / f"{path.name}.manifest.json"
    written.write_text(json.dumps(content))
    return content, written


def verify(path: Path, written: Path, capsys) -> tuple[int, str]:
    code = cli.main(["checkpoints", "verify", str(path), str(written)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_manifest_of_a_real_checkpoint_lists_every_file_and_the_metrics(checkpoint, capsys):
    content, written = manifest_of(checkpoint, capsys)
    assert content["format"] == "rlops.checkpoint-manifest/1" and content["layout"] == "trl"
    assert content["run"] == "run-a" and content["step"] == 4
    names = {f["path"] for f in content["files"]}
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "config.json"} <= names
    assert names == {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    assert content["total_bytes"] == sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    assert content["metrics"]["global_step"] == 4 and "reward" in content["metrics"]
    assert content["digest"] == manifest.digest(content)
    assert verify(checkpoint, written, capsys)[0] == 0


def test_crc32c_is_what_cloud_storage_reports(checkpoint, capsys):
    import base64

    import google_crc32c

    content, _ = manifest_of(checkpoint, capsys)
    entry = next(f for f in content["files"] if f["path"] == "model.safetensors")
    expected = google_crc32c.Checksum((checkpoint / "model.safetensors").read_bytes()).digest()
    assert base64.b64decode(entry["crc32c"]) == expected and len(expected) == 4


@pytest.mark.parametrize("change, kind", [
    ("flip", "changed"), ("truncate", "changed"), ("add", "extra"), ("remove", "missing"),
])
def test_verify_catches_every_kind_of_change(checkpoint, capsys, change, kind):
    _, written = manifest_of(checkpoint, capsys)
    weights = checkpoint / "model.safetensors"
    if change == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
    elif change == "truncate":
        with open(weights, "r+b") as stream:
            stream.truncate(weights.stat().st_size - 1)
    elif change == "add":
        (checkpoint / "notes.txt").write_text("x")
    else:
        (checkpoint / "scheduler.pt").unlink()
    code, out = verify(checkpoint, written, capsys)
    assert code == 1
    assert f"{kind}: " in out and "differs from" in out


def test_a_checkpoint_still_being_written_gets_no_manifest(trained, tmp_path, capsys):
    torn = tmp_path / "checkpoint-6"
    shutil.copytree(trained / "checkpoint-4", torn)
    (torn / "trainer_state.json").unlink()
    assert cli.main(["checkpoints", "manifest", str(torn)]) == 1
    assert "still being written or torn: no trainer_state.json" in capsys.readouterr().err
    nemo = tmp_path / "tmp_step_3"
    nemo.mkdir()
    assert cli.main(["checkpoints", "manifest", str(nemo)]) == 1
    assert "not a checkpoint directory" in capsys.readouterr().err


def test_paths_that_leave_the_checkpoint_are_refused(checkpoint, tmp_path, capsys):
    outside = tmp_path / "secret.txt"
    outside.write_text("not part of it")
    os.symlink(outside, checkpoint / "link")
    assert cli.main(["checkpoints", "manifest", str(checkpoint)]) == 1
    assert "outside the checkpoint" in capsys.readouterr().err
    (checkpoint / "link").unlink()
    content, written = manifest_of(checkpoint, capsys)
    content["files"][0]["path"] = "../secret.txt"
    content["digest"] = manifest.digest(content)
    written.write_text(json.dumps(content))
    code, out = verify(checkpoint, written, capsys)
    assert code == 1 and "would leave the checkpoint" in out


def test_a_changed_manifest_is_refused_by_its_digest(checkpoint, capsys):
    content, written = manifest_of(checkpoint, capsys)
    content["files"][0]["size"] += 1
    written.write_text(json.dumps(content))
    code, out = verify(checkpoint, written, capsys)
    assert code == 1 and "digest: the manifest was changed" in out


def test_a_nemo_rl_checkpoint_carries_its_training_info(tmp_path, capsys):
    step = tmp_path / "grpo-run" / "step_20"
    (step / "policy" / "weights" / "model").mkdir(parents=True)
    (step / "policy" / "weights" / "model" / "shard-0.safetensors").write_bytes(os.urandom(4096))
    (step / "training_info.json").write_text(json.dumps({"total_steps": 20, "val:accuracy": 0.61}))
    (step / "config.yaml").write_text("grpo: {}\n")
    (step / "train_dataloader.pt").write_bytes(b"\x80\x04")
    content, written = manifest_of(step, capsys)
    assert (content["layout"], content["run"], content["step"]) == ("nemo-rl", "grpo-run", 20)
    assert content["metrics"] == {"total_steps": 20, "val:accuracy": 0.61}
    assert verify(step, written, capsys)[0] == 0


def test_the_python_fallback_hashes_exactly_like_the_native_library(checkpoint, monkeypatch):
    native = manifest.hash_files(checkpoint, ["model.safetensors", "optimizer.pt"])
    assert manifest._native_extend() is not None  # this machine's wheel ships libcrc32c
    monkeypatch.setattr(manifest, "_native_extend", lambda: None)
    assert manifest.hash_files(checkpoint, ["model.safetensors", "optimizer.pt"]) == native


WITHOUT_GOOGLE_CRC32C = """
import json, sys
from pathlib import Path
sys.modules["google_crc32c"] = None  # as on a cluster image without it
sys.path[:0] = sys.argv[3:]
from rlops.checkpoints import manifest
print(json.dumps(manifest.hash_files(Path(sys.argv[1]), sys.argv[2].split(","))))
"""


def test_an_image_without_google_crc32c_hashes_with_the_library_shipped_with_the_job(checkpoint, tmp_path):
    names = ["model.safetensors", "optimizer.pt"]
    shipped = manifest.native_module(tmp_path / "job")  # what the snapshot tick uploads as a py_module
    assert shipped is not None and shipped.name == "rlops_crc32c"
    done = subprocess.run([sys.executable, "-c", WITHOUT_GOOGLE_CRC32C, str(checkpoint), ",".join(names),
                           str(shipped.parent)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == manifest.hash_files(checkpoint, names)
    alone = subprocess.run([sys.executable, "-c", WITHOUT_GOOGLE_CRC32C, str(checkpoint), ",".join(names)],
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0 and "no crc32c implementation here: install google-crc32c" in alone.stderr


def test_checkpoints_has_a_verb_for_each_use_so_any_environment_name_can_be_listed():
    parser = cli.build_parser()
    listed = parser.parse_args(["checkpoints", "list", "verify", "run-1"])  # an environment named `verify`
    assert (listed.environment, listed.run_name, listed.run.__name__) == ("verify", "run-1", "_list_checkpoints")
    verified = parser.parse_args(["checkpoints", "verify", "/ckpt", "/m.json"])
    assert (verified.path, verified.manifest, verified.run.__name__) == ("/ckpt", "/m.json", "_checkpoint_verify")
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["checkpoints", "local", "run-1"])  # the old form: no verb
    assert refused.value.code == 1


def test_a_bug_in_rlops_keeps_its_traceback_where_a_users_failure_is_one_line(monkeypatch, tmp_path, capsys):
    from rlops.checkpoints import manifest

    assert cli.main(["checkpoints", "manifest", str(tmp_path / "absent")]) == 1  # the user's to fix: one line
    assert capsys.readouterr().err.count("\n") == 1
    monkeypatch.setattr(manifest, "build", lambda path: {}["a key rlops forgot"])
    with pytest.raises(KeyError):  # not printed as if the user had done something wrong
        cli.main(["checkpoints", "manifest", str(tmp_path)])


def _run_with_three_checkpoints(trained: Path, tmp_path: Path) -> Path:
    """checkpoint-2 and checkpoint-4 as the recipe wrote them, and a checkpoint-6 made from checkpoint-4."""
    run = tmp_path / "run-r"
    for step, source in ((2, 2), (4, 4), (6, 4)):
        shutil.copytree(trained / f"checkpoint-{source}", run / f"checkpoint-{step}")
    return run


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_resume_skips_a_corrupted_a_torn_and_an_unmanifested_checkpoint_and_moves_them_aside(trained, tmp_path):
    from rlops.checkpoints import resume

    run = _run_with_three_checkpoints(trained, tmp_path)
    manifests = {step: manifest.build(run / f"checkpoint-{step}") for step in (2, 4, 6)}
    assert resume.prepare(run, manifests).to_json() == {"step": 6, "set_aside": []}  # all verify: the newest

    _flip_a_byte(run / "checkpoint-6" / "model.safetensors")  # after its manifest was written
    (run / "checkpoint-4" / "trainer_state.json").unlink()      # torn: the save never finished
    shutil.copytree(trained / "checkpoint-4", run / "checkpoint-8")  # complete, but no manifest yet
    point = resume.prepare(run, manifests)
    assert point.step == 2
    assert [(a.step, a.reason.split(":")[0]) for a in point.set_aside] == [
        (8, "no manifest yet"), (6, "does not match its manifest"), (4, "torn")]
    assert "1 changed (model.safetensors: crc32c" in point.set_aside[1].reason
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", resume.SET_ASIDE]  # moved, never deleted
    assert all((run / a.moved_to / "config.json").is_file() for a in point.set_aside)
    # The workload finds the verified one as the newest: it resumes exactly there.
    from rlops.workloads.trl_grpo import last_complete_checkpoint

    assert last_complete_checkpoint(str(run)) == str(run / "checkpoint-2")
    # The same step cut off again within the second (a save cut twice): both copies are kept (the previous names,
    # the step and the second, collided: "Directory not empty", and the attempt failed in its gate).
    for _ in range(2):
        shutil.copytree(trained / "checkpoint-4", run / "checkpoint-8")
        (run / "checkpoint-8" / "trainer_state.json").unlink()
        assert [a.step for a in resume.prepare(run, manifests).set_aside] == [8]
    assert len([p for p in (run / resume.SET_ASIDE).iterdir() if p.name.startswith("checkpoint-8-")]) == 3


def test_the_gate_each_attempt_runs_first_verifies_against_the_manifests_shipped_with_it(trained, tmp_path, capsys,
                                                                                         monkeypatch):
    """`python -m rlops.checkpoints.gate`, as a job runs it: the manifests come as the py_module `jobs.submit`
    stages; its one output line is what the watcher records. `--unverified` (resume_from: newest) hashes nothing."""
    from rlops.checkpoints import gate
    from rlops.runs import progress

    run = _run_with_three_checkpoints(trained, tmp_path)
    manifests = {step: manifest.build(run / f"checkpoint-{step}") for step in (2, 4, 6)}
    altered = {**manifests[4], "total_bytes": 1}  # a manifest changed in the bucket proves nothing: dropped
    gate.stage(tmp_path / "shipped", {2: manifests[2], 4: altered, 6: manifests[6]})
    monkeypatch.syspath_prepend(str(tmp_path / "shipped"))
    _flip_a_byte(run / "checkpoint-6" / "model.safetensors")
    shutil.copytree(run / "checkpoint-2", run / "checkpoint-8")
    (run / "checkpoint-8" / "trainer_state.json").unlink()
    assert gate.main(["--run-dir", str(run), "--unverified"]) == 0
    said = progress.resume_point(capsys.readouterr().out)
    assert said["step"] == 6 and not said["verified"] and [a["step"] for a in said["set_aside"]] == [8]
    assert gate.main(["--run-dir", str(run)]) == 0
    said = progress.resume_point("other output\n" + capsys.readouterr().out)
    assert said["step"] == 2 and said["verified"]
    assert [(a["step"], a["reason"].split(":")[0]) for a in said["set_aside"]] == [
        (6, "does not match its manifest"), (4, "no manifest yet")]
    assert gate.main(["--run-dir", str(tmp_path / "a-new-run")]) == 0  # the first attempt of a new run
    said = progress.resume_point(capsys.readouterr().out)
    assert time.time() - 60 < said.pop("at") <= time.time()  # when the attempt began running (rlops cost)
    assert said == {"step": None, "set_aside": [], "verified": True}


def test_with_no_checkpoint_that_verifies_the_run_starts_again_from_its_beginning(trained, tmp_path):
    from rlops.checkpoints import resume

    run = _run_with_three_checkpoints(trained, tmp_path)
    point = resume.prepare(run, {})
    assert point.step is None and [a.step for a in point.set_aside] == [6, 4, 2]
    assert [p.name for p in run.iterdir()] == [resume.SET_ASIDE]


def test_an_export_verifies_object_by_object_and_each_tampering_is_reported(trained, gcs, tmp_path):
    """Against fake-gcs-server through the real google-cloud-storage client: the crc32c it keeps per object is
    what the manifest holds per file."""
    from rlops.checkpoints import export
    from rlops.endpoints import Endpoints
    from rlops.state.bucket import client

    storage = client("test", Endpoints.from_environment())
    bucket = storage.lookup_bucket("rlops-exports") or storage.create_bucket("rlops-exports")
    content = manifest.build(trained / "checkpoint-4")
    destination = "exports/run-a"
    export.upload(bucket, destination, trained / "checkpoint-4", content)
    export.upload_manifest(bucket, destination, content)
    assert export.verify(bucket, destination, content) == {"missing": [], "extra": [], "changed": []}
    stored = bucket.blob(export.manifest_object(destination, 4)).download_as_bytes()
    assert export.checked(json.loads(stored)) == content
    imported = tmp_path / "elsewhere" / "run-a" / "checkpoint-4"
    imported.parent.mkdir(parents=True)
    export.download(bucket, destination, content, imported)  # an import: renamed into place once it verifies
    assert not any(manifest.verify(imported, content).values()) and sorted(p.name for p in imported.parent.iterdir()) \
        == ["checkpoint-4"]
    with pytest.raises(manifest.ManifestError, match="exists already"):
        export.download(bucket, destination, content, imported)

    prefix = export.objects_prefix(destination, 4)
    weights = bytearray((trained / "checkpoint-4" / "model.safetensors").read_bytes())
    weights[len(weights) // 2] ^= 0x01
    bucket.blob(prefix + "model.safetensors").upload_from_string(bytes(weights))  # one flipped byte
    bucket.blob(prefix + "trainer_state.json").delete()                          # one object missing
    bucket.blob(prefix + "notes.txt").upload_from_string(b"not part of it")     # one object extra
    assert export.verify(bucket, destination, content) == {
        "missing": ["trainer_state.json"], "extra": ["notes.txt"], "changed": ["model.safetensors"]}
    bucket.blob(prefix + "trainer_state.json").upload_from_filename(
        str(trained / "checkpoint-4" / "trainer_state.json"))
    torn = imported.with_name("checkpoint-5")
    with pytest.raises(manifest.ManifestError, match="does not match the manifest: 1 changed"):
        export.download(bucket, destination, content, torn)  # the flipped byte, caught before the rename
    assert not torn.exists(), "a copy that does not verify never looks like a checkpoint"
    with pytest.raises(manifest.ManifestError, match="altered"):
        export.checked({**content, "total_bytes": 1})
    for blob in bucket.list_blobs():
        blob.delete()


@pytest.mark.parametrize("name,why", [("/etc/x", "is absolute"), ("../x", "'..' part"), ("a/../../x", "'..' part"),
                                      ("a//x", "empty part"), ("a/", "empty part"), ("./x", "'.' part"),
                                      ("a\0b", "NUL"), ("", "non-empty"), (None, "non-empty")])
def test_a_name_from_data_that_would_leave_its_directory_is_refused(tmp_path, name, why):
    from rlops import paths

    with pytest.raises(paths.OutsideDirectory, match=why):
        paths.within(tmp_path, name, "entry")
    assert paths.within(tmp_path, "step-4/model.safetensors", "entry") == tmp_path / "step-4/model.safetensors"


def test_a_symlink_inside_the_directory_that_leads_out_is_refused(tmp_path):
    from rlops import paths

    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "out").symlink_to(tmp_path.parent)
    with pytest.raises(paths.OutsideDirectory, match="through a symlink"):
        paths.within(tmp_path / "inside", "out/x", "entry")


@pytest.mark.parametrize("hostile", ["../../escaped-dotdot", "/tmp/rlops-escaped-absolute", "a//tmp/escaped-slashes",
                                     "./escaped-dot"])
def test_an_import_of_a_hostile_export_writes_nothing_and_names_the_entry(trained, tmp_path, hostile):
    """A bucket anyone could write: the export of step 4 plus one object whose name leaves the checkpoint, and a
    manifest that lists it with a digest recomputed to match (a checksum proves nothing about its author). Against
    fake-gcs-server's memory backend, which keeps such names as Cloud Storage does."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from fakes.gcs import fake_gcs_in_memory
    from rlops.checkpoints import export

    with fake_gcs_in_memory() as url:
        bucket = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": url}).create_bucket("hostile-exports")
        content = manifest.build(trained / "checkpoint-4")
        export.upload(bucket, "shared/run-a", trained / "checkpoint-4", content)
        planted = b"import os; os.system('id')\n"
        prefix = export.objects_prefix("shared/run-a", 4)
        bucket.blob(prefix + hostile).upload_from_string(planted)
        assert prefix + hostile in {blob.name for blob in bucket.list_blobs()}, "the name was kept as written"
        crc32c = base64.b64encode(google_crc32c.value(planted).to_bytes(4, "big")).decode()
        forged = {**content, "files": [*content["files"], {"path": hostile, "size": len(planted), "crc32c": crc32c}]}
        forged["digest"] = manifest.digest(forged)
        assert manifest.intact(forged)
        target = tmp_path / "lustre" / "run-b" / "checkpoint-4"
        before = {path for path in tmp_path.parent.rglob("*")}
        with pytest.raises(manifest.ManifestError, match=f"{re.escape(repr(hostile))} .*would leave the checkpoint"):
            export.checked(forged)
        with pytest.raises(manifest.ManifestError, match=f"{re.escape(repr(hostile))} .*would leave the checkpoint"):
            export.download(bucket, "shared/run-a", forged, target)
        assert {path for path in tmp_path.parent.rglob("*")} == before, "the import wrote something"
        assert not Path("/tmp/rlops-escaped-absolute").exists()


def test_a_symlinked_checkpoint_directory_is_neither_manifested_nor_complete(trained, tmp_path, capsys):
    from rlops.checkpoints.layout import complete

    run = tmp_path / "run-c"
    run.mkdir()
    (run / "checkpoint-9").symlink_to(trained / "checkpoint-4")  # its files live elsewhere
    assert complete(run) == []
    with pytest.raises(manifest.ManifestError, match="a symlink to .*: rlops reads no checkpoint through a link"):
        manifest.build(run / "checkpoint-9")
    assert cli.main(["checkpoints", "manifest", str(run / "checkpoint-9")]) == 1


@pytest.mark.parametrize("argv", [["checkpoints", "list", "local", "../x"], ["report", "local", "../../etc"],
                                  ["logs", "local", "/abs"], ["status", "local", "--run", "a/b"],
                                  ["checkpoints", "export", "local", "x\0y"]])
def test_a_run_name_that_could_name_a_path_is_refused_before_anything_is_read(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 1 and "a run name is 1-40 lowercase letters" in capsys.readouterr().err


def test_a_tick_for_an_environment_name_that_leaves_the_directory_is_an_unknown_environment(tmp_path, monkeypatch):
    from rlops import sites

    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(tmp_path / "environments"))
    (tmp_path / "environments").mkdir()
    (tmp_path / "outside.yaml").write_text((REPO / "environments" / "local.yaml").read_text())
    with pytest.raises(sites.UnknownEnvironment, match=r"'\.\./outside\.yaml' has a '\.\.' part"):
        sites.load_environment("../outside")


def test_a_step_saved_again_after_a_resume_gets_the_manifest_of_its_new_save(trained, gcs, tmp_path):
    """Issue 34, 5: NeMo RL and the Trainer save step N again after resuming from an older checkpoint. Manifests
    were keyed by step and create-only: the new save never got one, `checkpoints list` said NO, an export refused
    it and every later resume set it aside. Now a save is told from another by `manifest.save_id` and its manifest
    replaces the earlier one, which is kept under replaced-manifests/."""
    import uuid

    from conftest import ENVIRONMENTS
    from rlops import waiting
    from rlops.endpoints import Endpoints
    from rlops.runs import snapshot
    from rlops.sites import Site
    from rlops.spec.load import load_or_raise
    from rlops.state.bucket import client
    from rlops.state.run_records import new

    run_dir = tmp_path / "lustre" / "checkpoints" / "tiny-arith" / "rs"
    for step in (2, 4):
        shutil.copytree(trained / f"checkpoint-{step}", run_dir / f"checkpoint-{step}")
    bucket = client("rlops-local", Endpoints.from_environment()).create_bucket(f"resave-{uuid.uuid4().hex[:12]}")
    events = []
    site = Site("local", load_or_raise(ENVIRONMENTS / "local.yaml"), Endpoints.from_environment(), None, bucket,
                events.append, lambda down: None, lambda down: waiting.on_local([], down), str(tmp_path / "lustre"),
                {"gpu_pool": 1}, checkpoints_here=True)
    site.records.create(new({"environment": "local", "recipe": "tiny-arith", "run": "rs", "requested-by": "tests",
                             "settings": "{}", "checkpoint-dir": str(run_dir), "attempt": "1"}, "rlops.local.rs.1",
                            time.time()))
    assert sorted(e["step"] for e in snapshot.tick(site)) == [2, 4]
    first = json.loads(site.records.manifest_objects("rs")[4].download_as_bytes())
    assert snapshot.tick(site) == []  # the same saves: nothing to do

    # Resumed from step 2, the run saves step 4 again: a new directory, other weights.
    shutil.rmtree(run_dir / "checkpoint-4")
    shutil.copytree(trained / "checkpoint-4", run_dir / "checkpoint-4", copy_function=shutil.copy)  # written now
    _flip_a_byte(run_dir / "checkpoint-4" / "model.safetensors")
    (event,) = snapshot.tick(site)
    assert event["step"] == 4 and event["replaced"] == first["save"]
    stored = json.loads(site.records.manifest_objects("rs")[4].download_as_bytes())
    assert stored["save"] == manifest.save_id(run_dir / "checkpoint-4") != first["save"]
    assert not any(manifest.verify(run_dir / "checkpoint-4", stored).values())  # it describes the new save
    kept = bucket.blob(site.records.layout.replaced_manifest("rs", 4, first["save"]))
    assert json.loads(kept.download_as_bytes()) == first
    assert site.records.get("rs")[0].manifests["4"]["save"] == stored["save"]
    assert [row["verified"] for row in snapshot.listing(site, "rs")] == ["yes", "yes"]
    assert snapshot.tick(site) == []


def test_a_snapshot_job_that_failed_on_the_cluster_is_said_and_collected(gcs, tmp_path, capsys):
    """A GKE snapshot tick collects its finished scan jobs: one that failed is said in a warning, with its Ray job,
    and deleted from Ray (Ray's JobSubmissionClient.delete_job), so that a later tick can scan again. Its warning
    once raised a TypeError instead: the job's message was passed as `emit`'s own."""
    import uuid
    from types import SimpleNamespace

    from conftest import ENVIRONMENTS
    from fakes.ray import Clock, SimulatedRay
    from rlops import waiting
    from rlops.cloud.ray_jobs import JobRequest
    from rlops.endpoints import Endpoints
    from rlops.runs import snapshot
    from rlops.sites import Site
    from rlops.spec.load import load_or_raise
    from rlops.state.bucket import client

    clock = Clock(1_000.0)
    ray = SimulatedRay(clock)
    scan_job = "rlops.local.snapshot.0123456789abcdef"
    ray.jobs[scan_job] = (JobRequest(scan_job, "python -m rlops.checkpoints.scan",
                                     {"rlops-environment": "local", "rlops-kind": "snapshot"}), clock())
    ray.script(scan_job, start=1, steps=[], end=2, status="FAILED")
    deleted = []
    ray.client = SimpleNamespace(delete_job=deleted.append)
    clock.now += 3
    bucket = client("rlops-local", Endpoints.from_environment()).create_bucket(f"scan-{uuid.uuid4().hex[:12]}")
    site = Site("local", load_or_raise(ENVIRONMENTS / "local.yaml"), Endpoints.from_environment(), ray, bucket,
                lambda event: None, lambda down: None, lambda down: waiting.on_local([], down),
                str(tmp_path / "lustre"), {"gpu_pool": 1}, checkpoints_here=False)

    assert snapshot.tick(site) == []
    assert deleted == [scan_job]
    said = capsys.readouterr()
    warning = next(line for line in (said.out + said.err).splitlines() if "snapshot job did not succeed" in line)
    assert scan_job in warning and "FAILED" in warning


def test_the_cluster_scan_manifests_a_known_step_again_only_when_it_was_saved_again(trained, capsys):
    from rlops.checkpoints import scan

    save = manifest.save_id(trained / "checkpoint-4")
    assert scan.main(["--run", f"a={trained}:2@{manifest.save_id(trained / 'checkpoint-2')},4@{save}"]) == 0
    assert capsys.readouterr().out == ""
    assert scan.main(["--run", f"a={trained}:2@,4@another-save"]) == 0  # 2: a link from before saves were told
    printed = [json.loads(line[len(scan.PREFIX):]) for line in capsys.readouterr().out.splitlines()]
    assert [(m["step"], m["save"]) for m in printed] == [(4, save)]


def test_the_gate_keeps_set_aside_within_the_recipes_limit_and_says_what_it_deleted(trained, tmp_path, capsys):
    """Issue 34, 6: set-aside/ grew without bound (a checkpoint can be hundreds of GB). The gate keeps the newest
    `--keep` set-asides within `--keep-bytes`; its line says what it deleted and what stays, which the run's
    report and `rlops status` show."""
    from rlops.checkpoints import gate, resume
    from rlops.runs import progress
    from rlops.runs.report_page import set_aside_said

    run = tmp_path / "run-k"
    size = sum(f.stat().st_size for f in (trained / "checkpoint-4").rglob("*") if f.is_file())
    said = []
    for attempt in range(1, 5):  # four attempts, each finding a torn checkpoint-8 to set aside
        shutil.copytree(trained / "checkpoint-4", run / "checkpoint-8")
        (run / "checkpoint-8" / "trainer_state.json").unlink()
        assert gate.main(["--run-dir", str(run), "--manifests", "no_such_module", "--keep", "3",
                          "--keep-bytes", str(3 * size)]) == 0
        point = progress.resume_point(capsys.readouterr().out)
        said.append({"attempt": attempt, "resume_point": point})
    assert [len(s["resume_point"].get("pruned", [])) for s in said] == [0, 0, 0, 1]
    assert said[-1]["resume_point"]["kept"][0] == 3 and len(list((run / resume.SET_ASIDE).iterdir())) == 3
    assert set_aside_said(said).startswith("set aside: 3 checkpoint(s), ")
    assert "deleted to stay within the recipe's set_aside limit: checkpoint-8-" in set_aside_said(said)
    # A byte bound tighter than two of them keeps one: the newest always stays.
    pruned, kept = resume.prune(run, count=10, max_bytes=size + 1)
    assert len(pruned) == 2 and kept[0] == 1


def test_the_recipes_set_aside_limit_reaches_the_gate():
    from conftest import ENVIRONMENTS, workload_words  # noqa: F401 - workload_words checks the gate's words
    from rlops.runs import jobs
    from rlops.spec.load import load_or_raise

    recipe = load_or_raise(ENVIRONMENTS / "local.yaml").recipes["tiny-arith"]
    words = jobs.request("local", "tiny-arith", recipe, "r", {}, "me", 1, "/lustre").entrypoint.split()
    assert words[words.index("--keep") + 1] == "5" and "--keep-bytes" not in words
    limited = recipe.model_copy(update={"set_aside": recipe.set_aside.model_copy(update={"count": 2, "gib": 100})})
    words = jobs.request("local", "tiny-arith", limited, "r", {}, "me", 1, "/lustre").entrypoint.split()
    assert words[words.index("--keep") + 1] == "2" and words[words.index("--keep-bytes") + 1] == str(100 * 2**30)


@pytest.mark.parametrize("url", ["s3://bucket/x", "gs://", "gs://bucket", "gs://bucket/", "gs:///x", "bucket/x"])
def test_an_export_destination_that_is_not_a_gs_bucket_and_prefix_is_refused_naming_the_flag(url):
    from types import SimpleNamespace

    from rlops.errors import Failure
    from rlops.runs.checkpoint_transfers import storage_location

    site = SimpleNamespace(endpoints=None, checkpoints_here=False)
    with pytest.raises(Failure, match=f"^--to {re.escape(url)}: expected gs://BUCKET/PREFIX$"):
        storage_location(site, url, "--to")  # refused before the site is read


def test_an_export_destination_is_its_bucket_and_its_prefix_without_slashes(monkeypatch):
    from types import SimpleNamespace

    from rlops.endpoints import Endpoints
    from rlops.runs.checkpoint_transfers import storage_location

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # a client with no credentials; nothing is asked
    site = SimpleNamespace(endpoints=Endpoints.from_environment(), checkpoints_here=False)
    bucket, prefix = storage_location(site, "gs://team-exports/gemma/runs/", "--to")
    assert (bucket.name, prefix) == ("team-exports", "gemma/runs")
