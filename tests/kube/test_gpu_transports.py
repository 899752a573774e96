"""Every GPU machine of the catalog (issue 38): each validates, and its network stack renders as the pinned upstream
manifests of GoogleCloudPlatform/container-engine-accelerators say, field by field, changed only where
`rlops.kube.transports.SUBSTITUTIONS` says; its cloud requests pass the fake GCP's discovery-document checks; the
doctor names its GPU quota family; cost prices it; each pool gets the placement its machine offers or requires (A4X's
workload policy, created before the pool and deleted after it).

The A4X environment is the h200 seed on GB200 (`a4x_text`); its dry-run transcript is checked in
(tests/golden/a4x.apply-dry-run.txt; after an intended change `RLOPS_UPDATE_GOLDEN=1`, then review the diff)."""

import copy
import json
import os

import kubernetes_validate
import pytest
import yaml

from conftest import ENVIRONMENTS, REPO
from render_support import crd_validator
from rlops import cli, costs
from rlops.kube import render, transports
from rlops.spec import catalog
from rlops.spec.load import load, load_text

UPSTREAM = REPO / "functions" / "rlops" / "spec" / "gpus" / "upstream"
# The shipped example of each transport.
EXAMPLES = {"h200": "rdma", "b200-spot": "rdma", "h100": "tcpx", "h100-mega": "tcpxo", "a100": "none"}


def upstream(path: str) -> list[dict]:
    """The copy, read independently of rlops: its first line names the pinned commit, the rest is upstream's."""
    first, rest = (UPSTREAM / path).read_text().split("\n", 1)
    assert first.startswith("# Source: github.com/GoogleCloudPlatform/container-engine-accelerators ") and \
        f"read at {catalog.UPSTREAM_COMMIT}" in first, first
    return [doc for doc in yaml.safe_load_all(rest) if doc]


def rendered(name: str, text: str | None = None) -> tuple[object, dict[tuple[str, str], dict]]:
    env = (load(ENVIRONMENTS / f"{name}.yaml") if text is None else load_text(text, name, f"{name}.yaml")).environment
    objs = render.objects(name, env, render.LiveFacts("10.90.0.5"))
    return env, {(o["kind"], o["metadata"]["name"]): o for o in objs}


def without_rlops_labels(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    labels = obj["metadata"]["labels"]
    for key in [k for k in labels if k.startswith("rlops-")]:
        del labels[key]
    return obj


def a4x_text() -> str:
    """The h200 seed on GB200 (A4X): 4 GPUs and 4 RDMA NICs a node, from a reservation."""
    text = (ENVIRONMENTS / "h200.yaml").read_text()
    text = text.replace("machine_type: a3-ultragpu-8g", "machine_type: a4x-highgpu-4g").replace(
        "{type: nvidia-h200-141gb, count: 8,", "{type: nvidia-gb200, count: 4,")
    text = text.replace("      - 192.168.5.0/24\n      - 192.168.6.0/24\n"
                        "      - 192.168.7.0/24\n      - 192.168.8.0/24\n", "")
    text = text.replace("worker: {cpu: 206, memory: 2400Gi}", "worker: {cpu: 130, memory: 700Gi}")
    return text.replace("cluster.gpus_per_node: 8", "cluster.gpus_per_node: 4").replace(
        "policy.generation.colocated.resources.gpus_per_node: 8",
        "policy.generation.colocated.resources.gpus_per_node: 4")


def test_every_machine_of_the_issue_is_in_the_catalog_and_each_shipped_example_validates(capsys):
    assert {"a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g", "a4x-highgpu-4g", "a2-highgpu-8g",
            "a2-ultragpu-8g"} <= set(catalog.GPU_MACHINES)
    assert {load(ENVIRONMENTS / f"{name}.yaml").environment.machine.transport.name for name in EXAMPLES} == \
        {"rdma", "tcpx", "tcpxo", "none"}
    assert cli.main(["validate", *(str(ENVIRONMENTS / f"{name}.yaml") for name in EXAMPLES)]) == 0, \
        capsys.readouterr().out


@pytest.fixture
def problems(tmp_path, capsys):
    """What `rlops validate` says of a spec text that does not validate."""
    def said(text: str) -> str:
        spec = tmp_path / "spec.yaml"
        spec.write_text(text)
        assert cli.main(["validate", str(spec)]) == 2
        return capsys.readouterr().out
    return said


def test_a4x_validates_with_4_gpus_and_nemo_rls_gpus_per_node_is_held_to_them(problems):
    env = load_text(a4x_text(), "a4x", "a4x.yaml").environment
    assert env.machine.accelerators_per_node == 4 and env.machine.installer.endswith("nccl-rdma-installer-a4x.yaml")
    said = problems(a4x_text().replace("cluster.gpus_per_node: 4", "cluster.gpus_per_node: 8"))
    assert 'overrides["cluster.gpus_per_node"]: 8 GPUs per node, but pool gpu-pool\'s nodes have 4; set 4' in said, said
    said = problems(a4x_text().replace("reservation: h200-reservation", "spot: true"))
    assert "a4x-highgpu-4g is not offered as Spot VMs; it comes as a reservation: set reservation: NAME" in said, said


def test_each_family_asks_for_its_own_networks_and_no_other(problems):
    mega = (ENVIRONMENTS / "h100-mega.yaml").read_text()
    said = problems(mega.replace("      - 192.168.8.0/24\n", ""))
    assert "networks.gpu_nics.subnet_cidrs: 7 subnets but a3-megagpu-8g has 8 GPU NICs; give exactly one subnet per " \
           "NIC (8)" in said, said
    said = problems(mega.replace("machine_type: a3-megagpu-8g", "machine_type: a3-ultragpu-8g").replace(
        "nvidia-h100-mega-80gb", "nvidia-h200-141gb"))
    assert "networks.gpu_nics: a3-ultragpu-8g (GPUDirect-RDMA (gIB)) uses no networks.gpu_nics; remove it and give " \
           "networks.gvnic, networks.rdma" in said, said
    assert "networks: a3-ultragpu-8g (GPUDirect-RDMA (gIB)) needs networks.rdma; add it" in said
    a100 = (ENVIRONMENTS / "a100.yaml").read_text()
    said = problems(a100.replace("  private_service_access:",
                                 "  gpu_nics: {prefix: x, subnet_cidrs: [192.168.1.0/24]}\n  private_service_access:"))
    assert "networks.gpu_nics: a2-ultragpu-8g (no GPUDirect (NCCL over the primary NIC)) uses no networks.gpu_nics; " \
           "remove it" in said, said


@pytest.mark.parametrize("name", ["h200", "b200-spot", "h100", "h100-mega", "a4x"])
def test_the_installers_are_upstreams_but_for_the_pools_accelerators(name):
    env, objs = rendered(name, a4x_text() if name == "a4x" else None)
    machine = env.machine
    wanted = [*(upstream(machine.transport.device_injector) if machine.transport.device_injector else []),
              *upstream(machine.installer)]
    got = [without_rlops_labels(o) for o in objs.values() if o["kind"] == "DaemonSet"]
    assert len(got) == len(wanted)
    for ours, theirs in zip(got, wanted, strict=True):
        if theirs["metadata"]["name"] == "device-injector":
            assert ours == theirs  # verbatim: it serves every accelerator it knows
            continue
        term = theirs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        accelerators = next(e for e in term["matchExpressions"] if e["key"] == "cloud.google.com/gke-accelerator")
        accelerators["values"] = [env.gpu_pools[0].accelerator.type]  # SUBSTITUTIONS: installer node affinity
        assert ours == theirs
        kubernetes_validate.validate(objs[("DaemonSet", ours["metadata"]["name"])], "1.33", strict=True)
    assert "installer node affinity" in transports.SUBSTITUTIONS


@pytest.mark.parametrize("name", ["h100", "h100-mega"])
def test_the_gpudirect_tcp_sidecar_and_pod_networking_are_upstreams(name):
    env, objs = rendered(name)
    transport = env.machine.transport
    (pod, *_) = [doc for doc in upstream(transport.pod) if doc["kind"] == "Pod"]
    (group,) = objs[("RayCluster", env.ray.cluster_name)]["spec"]["workerGroupSpecs"]
    template, spec = group["template"], group["template"]["spec"]
    annotations = template["metadata"]["annotations"]
    device = f"devices.gke.io/container.{transport.sidecar}"
    assert annotations[device] == pod["metadata"]["annotations"][device]
    assert json.loads(annotations["networking.gke.io/interfaces"]) == \
        json.loads(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert annotations["networking.gke.io/default-interface"] == pod["metadata"]["annotations"][
        "networking.gke.io/default-interface"]
    theirs = {c["name"]: c for c in pod["spec"]["containers"]}
    (sidecar,) = [c for c in spec["initContainers"] if c["name"] == transport.sidecar]
    assert sidecar == {**theirs[transport.sidecar], "restartPolicy": "Always"}  # SUBSTITUTIONS: native sidecar
    volumes = {v["name"]: v for v in spec["volumes"]}
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "shared-memory":  # SUBSTITUTIONS: the spec's size
            assert volumes["shared-memory"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(env.ray.shm_size)}
        elif volume["name"] != "config-volume":  # SUBSTITUTIONS: no test scripts
            assert volumes[volume["name"]] == volume
    (worker,) = spec["containers"]
    env_vars = {e["name"]: e["value"] for e in worker["env"]}
    assert all(env_vars[e["name"]] == e["value"] for e in theirs[transport.workload]["env"])
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    for mount in theirs[transport.workload]["volumeMounts"]:
        if mount["name"] == "tcpx-socket":  # SUBSTITUTIONS: the socket at /run/tcpx, said to the plugin
            assert mounts["tcpx-socket"] == {**mount, "mountPath": "/run/tcpx"}
            assert env_vars["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == "/run/tcpx"
        elif mount["name"] != "config-volume":
            assert mounts[mount["name"]] == mount
    assert {"sidecar as a native sidecar", "TCPX socket at /run/tcpx", "no test scripts", "shared memory"} <= \
        set(transports.SUBSTITUTIONS)
    crd_validator("RayCluster").validate(objs[("RayCluster", env.ray.cluster_name)])
    for (kind, _), obj in objs.items():
        if obj["apiVersion"] == "networking.gke.io/v1":
            crd_validator(kind).validate(obj)



def test_tcpx_takes_the_upstream_tests_nccl_settings_and_tcpxo_sources_the_plugins_profile():
    env, objs = rendered("h100")
    worker = objs[("RayCluster", "ray-a3")]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env_vars = {e["name"]: e["value"] for e in worker["env"]}
    # gpudirect-tcpx/nccl-config.yaml's mpirun -x settings, as written there (quotes off).
    assert env_vars["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
    assert env_vars["NCCL_GPUDIRECTTCPX_CTRL_DEV"] == "eth0" and env_vars["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env_vars["NCCL_GPUDIRECTTCPX_TX_BINDINGS"] == \
        "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"
    assert env_vars["NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS"] == "500000"
    assert env_vars["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64" and "NCCL_NET" not in env_vars
    params = {n: o["spec"] for (k, n), o in objs.items() if k == "GKENetworkParamSet"}
    assert params == {f"vpc{n}": {"vpc": f"a3-nic-net-{n}", "vpcSubnet": f"a3-nic-sub-{n}", "deviceMode": "NetDevice"}
                      for n in range(1, 5)}
    env, objs = rendered("h100-mega")
    worker = objs[("RayCluster", "ray-h100")]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert "source /usr/local/nvidia/lib64/nccl-env-profile.sh; ulimit" in worker["args"][0]
    assert {"name": "NCCL_LIB_DIR", "value": "/usr/local/nvidia/lib64"} in worker["env"]


def test_a2_has_no_gpu_nic_networks_installer_sidecar_or_interfaces():
    env, objs = rendered("a100")
    assert not [key for key in objs if key[0] in ("DaemonSet", "Network", "GKENetworkParamSet")]
    (group,) = objs[("RayCluster", "ray-a100")]["spec"]["workerGroupSpecs"]
    assert "networking.gke.io/interfaces" not in group["template"]["metadata"]["annotations"]
    assert "initContainers" not in group["template"]["spec"]
    worker = group["template"]["spec"]["containers"][0]
    assert worker["args"][0].startswith("set -e; ldconfig /usr/local/nvidia/lib64; ulimit -n 65536")
    crd_validator("RayCluster").validate(objs[("RayCluster", "ray-a100")])


@pytest.fixture
def example_projects(cloud_fakes, specs):
    """The new examples' projects in the fakes: their state buckets, token secrets and (h100) reservation."""
    from conftest import PLANTED_TOKENS
    from rlops.endpoints import Endpoints
    from rlops.state.bucket import client

    gcp, _ = cloud_fakes
    storage = client("test", Endpoints.from_environment())
    for project in ("rlops-h100-example", "rlops-a100-example", "rlops-h100-tcpx-example"):
        bucket = storage.lookup_bucket(f"{project}-state") or storage.create_bucket(f"{project}-state")
        for blob in bucket.list_blobs():
            blob.delete()
        for secret, value in PLANTED_TOKENS.items():
            gcp.put_secret(f"projects/{project}/secrets/{secret}/versions/latest", value)
    gcp.put_reservation("rlops-h100-tcpx-example", "us-central1-a", "a3-high-reservation", "a3-highgpu-8g",
                        "nvidia-h100-80gb", 8, count=2)
    return gcp


@pytest.mark.parametrize("name, nics", [("h100-mega",
                                         [(f"h100-nic-net-{n}", f"h100-nic-sub-{n}") for n in range(1, 9)]),
                                        ("h100", [(f"a3-nic-net-{n}", f"a3-nic-sub-{n}") for n in range(1, 5)]),
                                        ("a100", [])])
def test_apply_sends_each_familys_networks_through_the_discovery_checked_fake(example_projects, name, nics, capsys):
    gcp = example_projects
    assert cli.main(["apply", "--yes", name, "--skip-doctor"]) == 0, capsys.readouterr()
    (pool,) = [r.body["nodePool"] for r in gcp.mutations() if r.method == "POST" and r.path.endswith("/nodePools")]
    attached = (pool.get("networkConfig") or {}).get("additionalNodeNetworkConfigs", [])
    assert [(a["network"], a["subnetwork"]) for a in attached] == nics
    networks = {r.body["name"]: r.body for r in gcp.mutations() if r.method == "POST" and r.path.endswith("/networks")}
    assert all(networks[network]["mtu"] == 8244 and "networkProfile" not in networks[network] for network, _ in nics)
    firewalls = {r.body["name"] for r in gcp.mutations() if r.method == "POST" and r.path.endswith("/firewalls")}
    assert {network.replace("-net-", "-internal-") for network, _ in nics} <= firewalls
    assert cli.main(["plan", name, "--detailed-exitcode"]) == 0  # applied: nothing left to change


@pytest.mark.parametrize("name, family", [("h100-mega", "NVIDIA_H100_MEGA"), ("a100", "NVIDIA_A100_80GB")])
def test_the_doctor_names_each_familys_gpu_quota(example_projects, name, family, capsys):
    gcp = example_projects
    env = load(ENVIRONMENTS / f"{name}.yaml").environment
    gcp.gpu_family_quota[(env.project.id, env.region, family)] = 64
    cli.main(["doctor", name, "--format", "json"])
    found = {(f["check"], f["verdict"]) for f in json.loads(capsys.readouterr().out)}
    assert (f"gpu-quota {family}", "ok") in found, found
    assert ("network-profile", "ok") not in found and (f"machine type {env.gpu_pools[0].machine_type}", "ok") in found


def test_cost_prices_every_shipped_environments_pools_but_where_no_price_is_published():
    unpriced = {}
    for spec in sorted(ENVIRONMENTS.glob("*.yaml")):
        env = load(spec).environment
        for rate in costs.rates(env):
            if rate.usd_per_node_hour is None:
                unpriced[spec.stem] = rate.source
    # No public B200 Spot price for us-east1 was found (gpus/catalog.yaml says so): b200-spot states its estimate.
    assert unpriced == {}
    (b200,) = costs.rates(load(ENVIRONMENTS / "b200-spot.yaml").environment)
    assert b200.usd_per_node_hour == pytest.approx(39.6336) and b200.source == "the spec's negotiated rate"
    (mega,) = costs.rates(load(ENVIRONMENTS / "h100-mega.yaml").environment)
    assert mega.usd_per_node_hour == pytest.approx(37.391837) and "[CY] 2025-03-06" in mega.source


def test_placement_is_one_the_machine_offers_and_a4x_keeps_its_pool_in_one_nvlink_domain(problems):
    said = problems(a4x_text().replace("    reservation: h200-reservation\n",
                                       "    reservation: h200-reservation\n    placement: compact\n"))
    assert "gpu_pools[0].placement: a4x-highgpu-4g pools need the workload policy (NVLink domain 1x72) that GKE's " \
           "A4X node pools name; set placement: workload-1x72 or leave it unset" in said, said
    said = problems(a4x_text().replace("autoscaling: {min_nodes: 0, max_nodes: 2}",
                                       "autoscaling: {min_nodes: 0, max_nodes: 19}"))
    assert ("gpu_pools[0].autoscaling.max_nodes: 19 nodes, but the 1x72 workload policy holds 18 a4x-highgpu-4g "
            "nodes (72 GPUs, one NVLink domain); use at most 18") in said, said
    said = problems(a4x_text().replace("cluster:\n  name: rl-h200\n", f"cluster:\n  name: {'c' * 40}\n").replace(
        "  - name: gpu-pool\n", f"  - name: {'p' * 30}\n").replace("runner: nemo-rl\n", "runner: nemo-rl\n"))
    assert f"gpu_pools[0].name: the pool's workload policy is named CLUSTER-POOL, {'c' * 40}-{'p' * 30} (71 " \
           "characters), and a Compute name takes at most 63" in said, said
    h200 = (ENVIRONMENTS / "h200.yaml").read_text()
    said = problems(h200.replace("    reservation: h200-reservation\n",
                                 "    reservation: h200-reservation\n    placement: workload-1x72\n"))
    assert "gpu_pools[0].placement: a3-ultragpu-8g offers placement compact, not workload-1x72; use compact or " \
           "none" in said, said
    assert load_text(a4x_text(), "a4x", "a4x.yaml").environment.gpu_pools[0].placement_used.name == "workload-1x72"
    assert load(ENVIRONMENTS / "h200.yaml").environment.gpu_pools[0].placement_used is None


def _dry_run(name: str, text: str, folder, monkeypatch, capsys) -> str:
    (folder / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("RLOPS_ENVIRONMENTS", str(folder))
    monkeypatch.delenv("RLOPS_API_ENDPOINTS", raising=False)
    assert cli.main(["apply", name, "--dry-run", "--offline"]) == 0
    return capsys.readouterr().out


def _posted(transcript: str, path_end: str) -> list[dict]:
    return [json.loads(line.split(" ", 2)[2]) for line in transcript.splitlines()
            if line.startswith("POST ") and line.split(" ", 2)[1].endswith(path_end)]


def test_the_a4x_dry_run_creates_its_workload_policy_and_names_it_in_the_pool(tmp_path, monkeypatch, capsys):
    transcript = _dry_run("a4x", a4x_text(), tmp_path, monkeypatch, capsys)
    golden = REPO / "tests" / "golden" / "a4x.apply-dry-run.txt"
    if os.environ.get("RLOPS_UPDATE_GOLDEN"):
        golden.write_text(transcript)
    assert transcript == golden.read_text(), (
        f"the requests changed; if intended, RLOPS_UPDATE_GOLDEN=1 and review {golden}")
    (policy,) = _posted(transcript, "/regions/us-central1/resourcePolicies")
    assert policy["name"] == "rl-h200-gpu-pool" and policy["workloadPolicy"] == {
        "type": "HIGH_THROUGHPUT", "acceleratorTopology": "1x72"}
    (request,) = _posted(transcript, "/clusters/rl-h200/nodePools")
    # container v1 NodePool.PlacementPolicy, its enum as the client sends it (COMPACT is 1), as Cluster Toolkit's
    # gke-a4x blueprint makes it: type COMPACT and the workload policy's name.
    assert request["nodePool"]["placementPolicy"] == {"type": 1, "policyName": "rl-h200-gpu-pool"}
    lines = transcript.splitlines()
    assert lines.index("# create resource_policy/rl-h200-gpu-pool") < lines.index("# create node_pool/gpu-pool")
    # Compact placement elsewhere: GKE makes the policy, nothing is named.
    mega = (ENVIRONMENTS / "h100-mega.yaml").read_text().replace("    spot: true\n",
                                                                 "    spot: true\n    placement: compact\n")
    transcript = _dry_run("h100-mega", mega, tmp_path, monkeypatch, capsys)
    (request,) = _posted(transcript, "/nodePools")
    assert request["nodePool"]["placementPolicy"] == {"type": 1} and not _posted(transcript, "/resourcePolicies")
    for name in ("h200", "b200-spot", "h100", "h100-mega", "a100"):  # none asks for one
        assert "placementPolicy" not in (REPO / "tests" / "golden" / f"{name}.apply-dry-run.txt").read_text()


def test_a4x_workers_take_the_upstream_pods_rdma_interfaces_and_arm64_nodes():
    env, objs = rendered("a4x", a4x_text())
    (pod, *_) = [doc for doc in upstream(env.machine.pod) if doc["kind"] == "Pod"]
    (group,) = objs[("RayCluster", env.ray.cluster_name)]["spec"]["workerGroupSpecs"]
    ours = json.loads(group["template"]["metadata"]["annotations"]["networking.gke.io/interfaces"])
    theirs = json.loads(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
    # Every interface of the upstream pod, at its device name; rlops adds eth1 on gvnic-1 (the seeds' layout).
    assert [i for i in ours if i["network"] != "gvnic-1"] == theirs
    assert {"interfaceName": "eth1", "network": "gvnic-1"} in ours
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    spec = group["template"]["spec"]
    assert {e["key"]: e["values"] for e in term["matchExpressions"]} == {
        key: [spec["nodeSelector"][key]] for key in ("cloud.google.com/gke-accelerator", "kubernetes.io/arch")}
    assert {"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"} in \
        spec["tolerations"]
    crd_validator("RayCluster").validate(objs[("RayCluster", env.ray.cluster_name)])
    _, objs = rendered("h200")
    (group,) = objs[("RayCluster", "ray-cluster")]["spec"]["workerGroupSpecs"]
    assert "kubernetes.io/arch" not in group["template"]["spec"]["nodeSelector"]
    assert all(t["key"] != "kubernetes.io/arch" for t in group["template"]["spec"]["tolerations"])


def test_apply_makes_the_workload_policy_before_the_pool_and_destroy_deletes_it_after(cloud_fakes, specs, capsys):
    gcp, _ = cloud_fakes
    (specs / "a4x.yaml").write_text(a4x_text())
    assert cli.main(["apply", "a4x", "--skip-doctor", "--yes"]) == 0, capsys.readouterr()
    made = [(r.method, r.path.rsplit("/", 1)[-1]) for r in gcp.mutations() if r.method == "POST"]
    assert made.index(("POST", "resourcePolicies")) < made.index(("POST", "nodePools"))
    assert gcp.resources("resource_policy")["rl-h200-gpu-pool"]["workloadPolicy"] == {
        "type": "HIGH_THROUGHPUT", "acceleratorTopology": "1x72"}
    assert gcp.resources("node_pool")["gpu-pool"]["placementPolicy"]["policyName"] == "rl-h200-gpu-pool"
    assert cli.main(["plan", "a4x", "--detailed-exitcode"]) == 0  # applied: nothing left to change
    capsys.readouterr()
    assert cli.main(["destroy", "a4x", "--yes"]) == 0, capsys.readouterr()
    deleted = [r.path for r in gcp.mutations() if r.method == "DELETE"]
    pool = next(i for i, path in enumerate(deleted) if path.endswith("/nodePools/gpu-pool"))
    policy = next(i for i, path in enumerate(deleted) if path.endswith("/resourcePolicies/rl-h200-gpu-pool"))
    assert pool < policy and not gcp.resources("resource_policy")

