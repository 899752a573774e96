"""The in-cluster objects: valid against the real schemas, carrying the seeds' settings, and fixing their defects."""

import base64
import json
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import ENVIRONMENTS, REPO
from render_support import crd_validator, in_namespace_ray
from rlops import cli
from rlops.kube import render
from rlops.ownership import labels_for
from rlops.spec.load import load

SEEDS = {"h200": ("nvidia-h200-141gb", "tuner_config_a3u.txtpb"), "b200-spot": ("nvidia-b200", "tuner_config_a4.txtpb")}
PLANTED = "hf_PlantedTokenValue0123456789abcdefXYZ"


def rendered(name: str, secret_values=None) -> tuple[object, dict[tuple[str, str], dict]]:
    env = load(ENVIRONMENTS / f"{name}.yaml").environment
    objs = render.objects(name, env, render.LiveFacts("10.90.0.5"), secret_values)
    return env, {(o["kind"], o["metadata"]["name"]): o for o in objs}



@pytest.mark.parametrize("name", SEEDS)
def test_every_object_validates_against_its_schema(name):
    _, objs = rendered(name)
    for (kind, _), obj in objs.items():
        if kind == "RayCluster":
            crd_validator("RayCluster").validate(obj)
        elif obj["apiVersion"] == "networking.gke.io/v1":
            crd_validator(kind).validate(obj)
        else:
            kubernetes_validate.validate(obj, "1.33", strict=True)


def test_the_crd_schema_catches_what_kuberay_would_refuse():
    _, objs = rendered("h200")
    cluster = objs[("RayCluster", "ray-cluster")]
    cluster["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 8  # must be a string
    with pytest.raises(jsonschema.ValidationError):
        crd_validator("RayCluster").validate(cluster)


@pytest.mark.parametrize("kind, path, wrong", [
    ("GKENetworkParamSet", ("spec", "deviceMode"), "Rdma"),  # the enum is case-sensitive
    ("GKENetworkParamSet", ("spec", "vpcSubnet"), None),      # required
    ("Network", ("spec", "type"), "Devices"),
    ("Network", ("spec", "parametersRef", "kind"), None),
])
def test_the_network_schemas_catch_what_gke_would_refuse(kind, path, wrong):
    _, objs = rendered("h200")
    obj = objs[(kind, "rdma-0")]
    crd_validator(kind).validate(obj)
    *parents, leaf = path
    holder = obj
    for key in parents:
        holder = holder[key]
    if wrong is None:
        del holder[leaf]
    else:
        holder[leaf] = wrong
    with pytest.raises(jsonschema.ValidationError):
        crd_validator(kind).validate(obj)


@pytest.mark.parametrize("name", SEEDS)
def test_worker_groups_carry_the_seed_settings_and_the_fixes(name):
    env, objs = rendered(name)
    accelerator, tuner = SEEDS[name]
    cluster = objs[("RayCluster", env.ray.cluster_name)]
    assert cluster["spec"]["rayVersion"] == env.ray.ray_version
    (group,) = cluster["spec"]["workerGroupSpecs"]
    pod = group["template"]
    # G1: the NICs the RDMA networks give, on the pod template where GKE reads them.
    interfaces = json.loads(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [i["network"] for i in interfaces] == ["default", "gvnic-1"] + [f"rdma-{i}" for i in range(8)]
    assert [i["interfaceName"] for i in interfaces] == [f"eth{i}" for i in range(10)]
    assert pod["metadata"]["annotations"]["networking.gke.io/default-interface"] == "eth0"
    spec = pod["spec"]
    assert spec["nodeSelector"]["cloud.google.com/gke-accelerator"] == accelerator
    (worker,) = spec["containers"]
    env_vars = {e["name"]: e for e in worker["env"]}
    assert env_vars["NCCL_TUNER_CONFIG_PATH"]["value"] == f"/usr/local/gib/configs/{tuner}"
    for variable, value in {"NCCL_NET": "gIB", "NCCL_IB_GID_INDEX": "3", "NCCL_CROSS_NIC": "0",
                            "NCCL_NET_GDR_LEVEL": "PIX",
                            "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0",
                            "LD_LIBRARY_PATH": "/usr/local/gib/lib64:/usr/local/nvidia/lib64",
                            "HF_HOME": "/lustre/huggingface_cache"}.items():
        assert env_vars[variable]["value"] == value, variable
    # The tokens as files, each library pointed at its own (issue 32, 3).
    assert env_vars["HF_TOKEN_PATH"]["value"] == "/var/run/secrets/rlops/HF_TOKEN"
    assert env_vars["NETRC"]["value"] == "/var/run/secrets/rlops/netrc"
    assert worker["resources"]["requests"] == worker["resources"]["limits"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["securityContext"]["privileged"] is True
    assert {t["key"] for t in spec["tolerations"]} >= {"nvidia.com/gpu", "cloud.google.com/impending-node-termination"}
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    assert mounts == {"/dev/shm": "shared-memory", "/usr/local/nvidia": "nvidia", "/usr/local/gib": "gib",
                      "/lustre": "lustre", "/var/run/secrets/rlops": "tokens"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["shared-memory"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "240Gi"}
    assert volumes["gib"]["hostPath"]["path"] == "/home/kubernetes/bin/gib"
    assert volumes["lustre"]["persistentVolumeClaim"]["claimName"] == render.pvc_name(env)
    # G9: the worker waits for the installer's files rather than crash-looping.
    assert "set_nccl_env.sh" in spec["initContainers"][0]["command"][-1]
    # G3: no more workers than the pool can hold.
    assert group["replicas"] <= group["maxReplicas"] == env.gpu_pools[0].autoscaling.max_nodes
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": env.cluster.system_pool.name}
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"]["limits"]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"


def test_h200_matches_the_first_seed_sizes():
    env, objs = rendered("h200")
    cluster = objs[("RayCluster", "ray-cluster")]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"cpu": "206", "memory": "2400Gi", "nvidia.com/gpu": "8"}
    assert head["resources"]["limits"] == {"cpu": "64", "memory": "500G"}
    # Through the region's remote repository of nvcr.io (ray.image_cache, on by default), its path kept.
    assert head["image"] == worker["image"] == \
        "us-central1-docker.pkg.dev/rlops-h200-example/rlops-nvcr-io/nvidia/nemo-rl:v0.5.0"
    account = objs[("ServiceAccount", "generic-ksa")]
    assert account["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "rlops-ray@rlops-h200-example.iam.gserviceaccount.com"}


@pytest.mark.parametrize("name", SEEDS)
def test_lustre_volume_network_mapping_and_installer(name):
    env, objs = rendered(name)
    pv = objs[("PersistentVolume", f"{env.lustre.name}-pv")]
    assert pv["spec"]["csi"] == {"driver": "lustre.csi.storage.gke.io",
                                 "volumeHandle": f"{env.project.id}/{env.zone}/{env.lustre.name}",  # G12: 3 tokens
                                 "volumeAttributes": {"ip": "10.90.0.5", "filesystem": env.lustre.filesystem}}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["capacity"]["storage"] == f"{env.lustre.capacity_gib}Gi" and pv["spec"]["storageClassName"] == ""
    pvc = objs[("PersistentVolumeClaim", render.pvc_name(env))]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pvc["spec"]["storageClassName"] == ""
    assert pv["spec"]["claimRef"] == {"namespace": pvc["metadata"]["namespace"], "name": pvc["metadata"]["name"]}

    params = {n: o["spec"] for (k, n), o in objs.items() if k == "GKENetworkParamSet"}
    prefix = env.networks
    assert params["gvnic-1"] == {"vpc": f"{prefix.gvnic.prefix}-net", "vpcSubnet": f"{prefix.gvnic.prefix}-sub",
                                 "deviceMode": "NetDevice"}
    for i in range(8):
        assert params[f"rdma-{i}"] == {"vpc": f"{prefix.rdma.prefix}-net", "vpcSubnet": f"{prefix.rdma.prefix}-sub-{i}",
                                       "deviceMode": "RDMA"}
        assert objs[("Network", f"rdma-{i}")]["spec"]["parametersRef"]["name"] == f"rdma-{i}"

    installer = objs[("DaemonSet", "nccl-rdma-installer")]
    spec = installer["spec"]["template"]["spec"]
    values = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert values["matchExpressions"][0]["values"] == [SEEDS[name][0]]
    assert spec["initContainers"][0]["image"].endswith("nccl-plugin-gib:v1.1.1")
    assert spec["hostNetwork"] and spec["hostPID"] and spec["priorityClassName"] == "system-node-critical"
    assert all(o["metadata"]["labels"]["rlops-managed-by"] == "rlops" for o in objs.values())


def worker_start(tmp_path, nccl_env_script: str) -> subprocess.CompletedProcess:
    """The worker container's command as the pod would run it, with /usr/local under tmp_path, a recording
    ldconfig, and KubeRay's generated `ray start` standing in as a command that prints what it inherits."""
    _, objs = rendered("h200")
    (group,) = objs[("RayCluster", "ray-cluster")]["spec"]["workerGroupSpecs"]
    assert group["template"]["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    (worker,) = group["template"]["spec"]["containers"]
    root = tmp_path / "usr-local"
    (root / "gib" / "scripts").mkdir(parents=True)
    (root / "gib" / "scripts" / "set_nccl_env.sh").write_text(nccl_env_script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ldconfig").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/ldconfig.calls\n")
    (bin_dir / "ldconfig").chmod(0o755)
    command = [part.replace("/usr/local/", f"{root}/") for part in worker["command"] + worker["args"]]
    env = {e["name"]: e["value"].replace("/usr/local/", f"{root}/") for e in worker["env"]}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin",
               KUBERAY_GEN_RAY_START_CMD='echo "ray start with NCCL_FROM_GIB=$NCCL_FROM_GIB LD=$LD_LIBRARY_PATH"')
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.servers
def test_the_worker_starts_ray_with_the_gib_settings_and_not_at_all_when_they_fail(tmp_path):
    started = worker_start(tmp_path / "ok", "export NCCL_FROM_GIB=yes\n")
    assert started.returncode == 0, started.stderr
    local = tmp_path / "ok" / "usr-local"
    assert started.stdout.splitlines()[-1] == (
        f"ray start with NCCL_FROM_GIB=yes LD={local}/gib/lib64:{local}/nvidia/lib64")
    failed = worker_start(tmp_path / "bad", "false\nexport NCCL_FROM_GIB=yes\n")
    assert failed.returncode != 0 and "ray start" not in failed.stdout


def test_render_redacts_secrets_and_a_planted_token_stays_in_the_secret_alone(capsys, monkeypatch):
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(ENVIRONMENTS))
    assert cli.main(["render", "h200", "--offline"]) == 0
    stream = capsys.readouterr().out
    docs = list(yaml.safe_load_all(stream))
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["data"] == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": "<redacted>", "netrc": "<redacted>"}
    env, objs = rendered("h200", {"HF_TOKEN": PLANTED, "WANDB_API_KEY": "0" * 40})
    encoded = base64.b64encode(PLANTED.encode()).decode()
    holding = [key for key, obj in objs.items() if PLANTED in json.dumps(obj) or encoded in json.dumps(obj)]
    assert holding == [("Secret", render.secret_name(env))]


def containers_of(doc: dict) -> list[dict]:
    templates = render.pod_templates(doc) if doc["kind"] == "RayCluster" else \
        [doc["spec"]["template"]] if doc["kind"] == "DaemonSet" else []
    return [c for t in templates for c in t["spec"].get("initContainers", []) + t["spec"]["containers"]]


@pytest.mark.parametrize("name", SEEDS)
def test_render_offline_shows_no_token_in_any_containers_env_and_mounts_them_for_the_pods_user_alone(
        name, capsys, monkeypatch):
    """Issue 32, 3: NeMo RL copies the driver's environment into every actor, where Ray's state API shows it; so
    no container's environment may carry a token, by value or by reference. The tokens are files only root (the
    pods' user, the owner the kubelet gives them) may read."""
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(ENVIRONMENTS))
    assert cli.main(["render", name, "--offline"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    env = load(ENVIRONMENTS / f"{name}.yaml").environment
    containers = [c for doc in docs for c in containers_of(doc)]
    assert {"ray-head", "ray-worker"} < {c["name"] for c in containers}  # and the installers' and sidecars'
    for container in containers:
        assert "envFrom" not in container, container["name"]
        for variable in container.get("env", []):
            assert set(variable) == {"name", "value"}, variable  # a literal: no secretKeyRef, no valueFrom at all
            assert variable["name"] not in env.secrets, variable
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    for template in render.pod_templates(cluster):
        pod = template["spec"]
        assert "fsGroup" not in pod["securityContext"] and pod["securityContext"]["runAsUser"] == 0
        (volume,) = [v["secret"] for v in pod["volumes"] if "secret" in v]
        assert volume == {"secretName": secret["metadata"]["name"], "defaultMode": 0o400}
        (ray,) = [c for c in pod["containers"] if c["name"].startswith("ray-")]
        assert ray.get("securityContext", {}).get("runAsUser", 0) == 0
        (mount,) = [m for m in ray["volumeMounts"] if m["name"] == "tokens"]
        assert mount["readOnly"] is True
        pointers = {e["name"]: e["value"] for e in ray["env"] if e["name"] in ("HF_TOKEN_PATH", "NETRC")}
        assert pointers == {"HF_TOKEN_PATH": f"{mount['mountPath']}/HF_TOKEN", "NETRC": f"{mount['mountPath']}/netrc"}
        assert {value.rsplit("/", 1)[1] for value in pointers.values()} <= set(secret["data"])


@pytest.mark.servers
def test_hugging_face_and_the_netrc_lookup_wandb_uses_read_the_tokens_from_the_secrets_files(tmp_path):
    """The files as the Secret volume lays them out, read the way each library reads them: huggingface_hub by
    HF_TOKEN_PATH (in a fresh interpreter: it reads the variable on import), W&B's key by requests' netrc lookup for
    its server (wandb/sdk/lib/apikey.py), and nothing of it from the environment."""
    import requests

    env, objs = rendered("h200", {"HF_TOKEN": PLANTED, "WANDB_API_KEY": "5" * 40})
    mounted = tmp_path / "tokens"
    mounted.mkdir()
    for name, value in objs[("Secret", render.secret_name(env))]["data"].items():
        (mounted / name).write_bytes(base64.b64decode(value))
    (worker,) = (objs[("RayCluster", env.ray.cluster_name)]["spec"]["workerGroupSpecs"][0]
                 ["template"]["spec"]["containers"])
    pointed = {e["name"]: e["value"].replace("/var/run/secrets/rlops", str(mounted)) for e in worker["env"]}
    probe = "import huggingface_hub; print(huggingface_hub.get_token())"
    quiet = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    read = subprocess.run([sys.executable, "-c", probe], env={**quiet, "HF_TOKEN_PATH": pointed["HF_TOKEN_PATH"]},
                          capture_output=True, text=True, check=True)
    assert read.stdout.strip() == PLANTED
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NETRC", pointed["NETRC"])
        assert requests.utils.get_netrc_auth("https://api.wandb.ai") == ("user", "5" * 40)


@pytest.mark.servers
def test_an_installed_rlops_renders_from_its_package_data(tmp_path):
    """Not only from a checkout: the base objects ship in the wheel, as a pip install would lay them out."""
    import shutil
    import sys

    source = tmp_path / "source"  # a build writes build/ next to the sources: not into the checkout
    shutil.copytree(REPO / "functions", source / "functions",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(tmp_path / "wheel")], check=True)
    (wheel,) = (tmp_path / "wheel").glob("rlops-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True)
    probe = ("import rlops, rlops.kube.render as r; print(rlops.__file__); "
             "print(sorted(o['kind'] for o in r.base('raycluster.yaml')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith(str(tmp_path / "site")), out
    assert out[1] == "['RayCluster']"


def test_a_namespace_of_its_own_is_rendered_first_and_holds_every_namespaced_object(specs, capsys):
    assert cli.main(["render", "h200", "--offline"]) == 0
    assert "Namespace" not in [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)], "default is built in"
    in_namespace_ray(specs)
    assert cli.main(["render", "h200", "--offline"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    namespace = docs[0]
    assert (namespace["kind"], namespace["metadata"]["name"]) == ("Namespace", "ray")
    assert namespace["metadata"]["labels"] == labels_for("h200"), namespace["metadata"]
    kubernetes_validate.validate(namespace, "1.33", strict=True)
    placed = {(d["kind"], d["metadata"].get("namespace")) for d in docs[1:]}
    assert {("ServiceAccount", "ray"), ("Secret", "ray"), ("PersistentVolumeClaim", "ray"),
            ("RayCluster", "ray")} <= placed
    # Only the gIB installer stays in kube-system, where it runs on every GPU node; the rest is cluster-scoped.
    assert {ns for _, ns in placed} == {"ray", "kube-system", None}
    assert [kind for kind, ns in placed if ns == "kube-system"] == ["DaemonSet"]
    (pv,) = [d for d in docs if d["kind"] == "PersistentVolume"]
    assert pv["spec"]["claimRef"]["namespace"] == "ray"


def test_validate_refuses_a_service_account_outside_the_pods_namespace_at_its_line(specs, capsys):
    spec = in_namespace_ray(specs, account_too=False)
    line = spec.read_text().splitlines().index("    namespace: default") + 1
    assert cli.main(["validate", str(spec)]) == 2
    out = capsys.readouterr().out
    assert f"h200.yaml:{line}:16: cluster.service_account.namespace: the service account is in namespace default but " \
           "the Ray pods run in ray (ray.namespace)" in out, out
    assert "set namespace: ray here" in out
