"""The in-cluster objects through apply against the fake GCP control plane and the fake Kubernetes API."""

import base64
import json

import pytest

from conftest import PLANTED_TOKENS
from fakes import kube_rules
from rlops import cli
from rlops.cloud import base
from rlops.endpoints import Endpoints
from rlops.spec.images import cached


@pytest.fixture
def fakes(cloud_fakes, specs, monkeypatch):
    monkeypatch.setattr(base, "RETRY", base.RetryPolicy(attempts=10, base_seconds=0.02, cap_seconds=0.2))
    return cloud_fakes


def test_apply_creates_the_objects_a_second_apply_writes_nothing(fakes, capsys):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    kinds = {r.path.split("/")[-2] for r in kube.writes() if r.method == "PATCH"}
    assert kinds >= {"rayclusters", "daemonsets", "persistentvolumes", "persistentvolumeclaims", "secrets",
                     "serviceaccounts", "networks", "gkenetworkparamsets"}
    assert all(r.query.get("fieldManager") == "rlops" and r.content_type.startswith("application/apply-patch+yaml")
               for r in kube.writes() if r.method == "PATCH")
    before = len(kube.writes())
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert kube.writes()[before:] == [], "a second apply wrote to the cluster"
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0


def test_a_planted_token_reaches_the_secret_write_and_nowhere_else(fakes, capsys):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert cli.main(["plan", "h200"]) == 0
    assert cli.main(["render", "h200"]) == 0
    out = capsys.readouterr()
    for token in PLANTED_TOKENS.values():
        encoded = base64.b64encode(token.encode()).decode()
        assert token not in out.out + out.err and encoded not in out.out + out.err
        assert not [r for r in kube.requests if token in json.dumps(r.body)]
        carriers = [r for r in kube.requests if encoded in json.dumps(r.body)]
        assert carriers and all(r.path.endswith("/secrets/ray-cluster-tokens") and r.method == "PATCH"
                                for r in carriers)
        assert not [r for r in gcp.requests if token in json.dumps(r.body) or encoded in json.dumps(r.body)]
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    assert not any(token in json.dumps(cluster) for token in PLANTED_TOKENS.values())


def test_reaped_replicas_are_not_drift_and_what_rlops_no_longer_renders_is_pruned(fakes, capsys):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = 0  # what the idle reaper does
    kube.objects[("rayclusters", "default", "ray-cluster")] = cluster
    # An object an earlier version of the spec had (a ninth RDMA network), with rlops's labels.
    stale = kube.get("networks", "rdma-7")
    stale["metadata"]["name"] = "rdma-8"
    kube.put(stale, "networks")
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    out = capsys.readouterr().out
    assert "- Network/rdma-8" in out and "RayCluster" not in out
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert kube.get("networks", "rdma-8") is None and kube.get("networks", "rdma-7") is not None
    assert kube.get("rayclusters", "ray-cluster", "default")["spec"]["workerGroupSpecs"][0]["replicas"] == 0


def test_an_object_without_rlops_labels_is_never_touched(fakes, capsys):
    gcp, kube = fakes
    kube.put({"apiVersion": "v1", "kind": "ServiceAccount",
              "metadata": {"name": "generic-ksa", "namespace": "default", "labels": {"team": "ml"}}}, "serviceaccounts")
    assert cli.main(["apply", "--yes", "h200"]) == 1
    assert "without rlops's labels" in capsys.readouterr().err
    assert kube.get("serviceaccounts", "generic-ksa", "default")["metadata"]["labels"] == {"team": "ml"}
    assert not [r for r in kube.writes() if "serviceaccounts" in r.path]


def test_destroy_deletes_the_cluster_objects_first(fakes):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert cli.main(["destroy", "h200", "--yes"]) == 0
    deletes = [r.path for r in kube.writes() if r.method == "DELETE"]
    assert deletes and "rayclusters" in deletes[0]
    assert set(kube.objects) == {("namespaces", "", name) for name in kube_rules.BUILT_IN_NAMESPACES}


def test_a_cluster_that_is_not_ready_in_time_fails_apply_naming_it_and_a_rerun_finishes(fakes, capsys):
    gcp, kube = fakes
    kube.controller_delay = None  # no controller: nothing ever reports ready
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "0.3"]) == 1
    err = capsys.readouterr().err
    assert "DaemonSet/kube-system/" in err and "not ready after 0s: the controller has not seen generation 1" in err
    # The objects were written; once the controllers catch up, the same apply finishes without writing again.
    # (The RayCluster's readiness is read from its pods, whatever KubeRay writes in its status.)
    installer = next(key for key in kube.objects if key[0] == "daemonsets")
    kube.set_status("daemonsets", installer[2], {"desiredNumberScheduled": 2, "numberReady": 2,
                                                 "updatedNumberScheduled": 2, "observedGeneration": 1}, installer[1])
    before = len(kube.writes())
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0
    assert kube.writes()[before:] == []
    assert "ready: RayCluster/default/ray-cluster (head ready, 2 of 2 workers ready, 0 needed; 3 pods on the current " \
        "template)" in capsys.readouterr().out


@pytest.mark.servers
def test_the_dns_endpoint_is_reached_with_the_callers_google_token_and_no_kubeconfig(monkeypatch, tmp_path):
    """The real google-auth refresh against a local token endpoint; the client is aimed at the DNS endpoint."""
    from urllib.parse import parse_qs

    from fakes.jsonhttp import JsonServer, reply
    from rlops.kube import cluster

    grants = []

    def token_endpoint(http):
        grants.append(parse_qs(http.rfile.read(int(http.headers["Content-Length"])).decode()))
        reply(http, 200, {"access_token": "ya29.caller-token", "expires_in": 3600, "token_type": "Bearer"})

    server = JsonServer(token_endpoint, "fake-oauth")
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        adc = tmp_path / "adc.json"
        adc.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k",
                                   "private_key": key.decode(), "client_email": "ci@p.iam.gserviceaccount.com",
                                   "client_id": "1", "token_uri": server.url + "/token"}))
        monkeypatch.delenv("RLOPS_KUBE_API", raising=False)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        api = cluster.connect("gke-0123456789abcdef-123456789012.us-central1.gke.goog", Endpoints())
    finally:
        server.stop()
    configuration = api.api.configuration
    assert configuration.host == "https://gke-0123456789abcdef-123456789012.us-central1.gke.goog"
    assert configuration.get_api_key_with_prefix("authorization") == "Bearer ya29.caller-token"
    assert configuration.verify_ssl
    assert grants and grants[0]["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    assert not (tmp_path / "home").exists(), "connecting wrote something to the home directory (a kubeconfig?)"


def test_a_cluster_without_a_dns_endpoint_is_refused_with_the_fix(monkeypatch):
    from rlops.kube import cluster

    monkeypatch.delenv("RLOPS_KUBE_API", raising=False)
    with pytest.raises(cluster.KubeError, match="cluster.dns_endpoint: true"):
        cluster.connect(None, Endpoints())


@pytest.mark.parametrize("env_name", ["h200", "b200-spot"])
def test_after_apply_a_plan_is_clean_a_console_edit_is_drift_and_the_reapers_replicas_are_not(fakes, capsys, env_name):
    from kubernetes import client

    from rlops.kube.cluster import KubeApi
    from rlops.kube.objects import Ref

    gcp, kube = fakes
    assert cli.main(["apply", "--yes", env_name]) == 0
    installer = next(obj for key, obj in kube.objects.items() if key[0] == "daemonsets")
    container = installer["spec"]["template"]["spec"]["initContainers"][0]
    assert container["terminationMessagePolicy"] == "File" and container["imagePullPolicy"], "the fake did not default"
    capsys.readouterr()
    assert cli.main(["plan", env_name, "--detailed-exitcode"]) == 0, capsys.readouterr().out

    # The reaper's write: its own field manager, and not drift.
    api = KubeApi(client.ApiClient(client.Configuration(host=kube.url)))
    _, namespace, name = next(key for key in kube.objects if key[0] == "rayclusters")
    cluster = kube.get("rayclusters", name, namespace)
    assert api.set_worker_replicas(Ref("RayCluster", name, namespace),
                                   {g["groupName"]: 0 for g in cluster["spec"]["workerGroupSpecs"]})
    assert "rlops-reaper" in kube.managers("rayclusters", name, namespace)
    assert cli.main(["plan", env_name, "--detailed-exitcode"]) == 0, capsys.readouterr().out

    # A console edit of a field rlops owns is drift, named by its path.
    def new_image(obj):
        obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = "example.com/ray:edited"

    kube.edit("rayclusters", name, new_image, namespace=namespace)
    capsys.readouterr()
    assert cli.main(["plan", env_name, "--detailed-exitcode"]) == 2
    assert "headGroupSpec.template.spec.containers[ray-head].image" in capsys.readouterr().out
    assert cli.main(["apply", "--yes", env_name]) == 0
    applied = kube.get("rayclusters", name, namespace)["spec"]
    assert applied["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] != "example.com/ray:edited"
    assert all(g["replicas"] == 0 for g in applied["workerGroupSpecs"])


def test_a_token_removed_from_the_spec_is_removed_from_the_cluster(fakes, specs):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    # Each token a file of the Ray pods' Secret volume, and W&B's key as the netrc W&B reads too (issue 32, 3).
    assert set(kube.get("secrets", "ray-cluster-tokens", "default")["data"]) == {"HF_TOKEN", "WANDB_API_KEY", "netrc"}
    spec = specs / "h200.yaml"
    text = spec.read_text()
    spec.write_text(text.replace("  WANDB_API_KEY:\n    secret_manager: projects/rlops-h200-example/secrets/"
                                 "wandb-api-key/versions/latest\n", ""))
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert set(kube.get("secrets", "ray-cluster-tokens", "default")["data"]) == {"HF_TOKEN"}


def test_a_kind_not_served_yet_is_said_in_the_plan_waited_for_by_apply_and_never_pruned(fakes, capsys):
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    kube.uninstall("networking.gke.io/v1")
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    out = capsys.readouterr().out
    assert "Network/rdma-0  (Network is not served yet; GKE multi-networking" in out
    assert "- Network" not in out
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "0.3"]) == 1
    assert "waiting for GKENetworkParamSet to be served" in capsys.readouterr().err
    kube.install("networking.gke.io/v1")
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert kube.get("networks", "rdma-0") is not None


def test_lustre_grown_in_place_and_replaced_reaches_the_cluster_and_the_next_plan_is_clean(fakes, specs, capsys):
    """Growing keeps the PVC's request (a claim of class "" cannot be resized: PersistentVolumeClaimResize) and
    grows the PV; a replaced instance has a new address, which a PV's source cannot take (immutable), so the
    PV, its claim and the RayCluster that mounts it are replaced, in the order the API allows."""
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    pv = kube.get("persistentvolumes", "rl-lustre-pv")
    first_ip = pv["spec"]["csi"]["volumeAttributes"]["ip"]
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("capacity_gib: 18000", "capacity_gib: 36000"))
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    assert kube.get("persistentvolumes", "rl-lustre-pv")["spec"]["capacity"]["storage"] == "36000Gi"
    assert kube.get("persistentvolumeclaims", "rl-lustre-pvc", "default")["status"]["phase"] == "Bound"
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out

    cluster_uid = kube.get("rayclusters", "ray-cluster", "default")["metadata"]["uid"]
    spec.write_text(spec.read_text().replace("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 250")
                    .replace("deletion_policy: retain", "deletion_policy: delete"))
    assert cli.main(["apply", "--yes", "h200", "--delete-data"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    replaced = kube.get("persistentvolumes", "rl-lustre-pv")
    assert replaced["spec"]["csi"]["volumeAttributes"]["ip"] != first_ip
    assert replaced["status"]["phase"] == "Bound"
    assert kube.get("rayclusters", "ray-cluster", "default")["metadata"]["uid"] != cluster_uid, out
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out


def test_a_spot_shortfall_is_ready_with_the_pools_min_nodes_and_says_how_many_of_how_many(fakes, specs, capsys):
    """Eight Spot B200 workers asked for, three nodes granted: ready once the head and min_nodes workers are."""
    gcp, kube = fakes
    kube.grant_gpu_nodes(3)
    assert cli.main(["apply", "--yes", "b200-spot", "--ready-timeout", "20"]) == 0
    assert "ready: RayCluster/default/ray-a4-gpu-spot (head ready, 3 of 8 workers ready, 0 needed; 9 pods" in \
        capsys.readouterr().out
    spec = specs / "b200-spot.yaml"
    spec.write_text(spec.read_text().replace("autoscaling: {min_nodes: 0, max_nodes: 8}",
                                             "autoscaling: {min_nodes: 4, max_nodes: 8}")
                    .replace("scale_down: [ray-workers, node-pools]", "scale_down: [ray-workers]"))
    assert cli.main(["apply", "--yes", "b200-spot", "--ready-timeout", "1"]) == 1
    assert "not ready after 1s: head ready, 3 of 8 workers ready, 4 needed" in capsys.readouterr().err
    kube.grant_gpu_nodes(4)
    assert cli.main(["apply", "--yes", "b200-spot", "--ready-timeout", "20"]) == 0


def test_the_reapers_patch_cannot_resize_the_wrong_group_when_the_list_was_reordered_meanwhile(fakes):
    """Its replace is by index in an atomic list; a `test` of the group's name at that index makes a write that
    landed between its read and its patch fail the whole patch (RFC 6902) instead of resizing another group."""
    from kubernetes import client

    from rlops.kube.cluster import KubeApi, KubeError
    from rlops.kube.objects import Ref

    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200"]) == 0
    ref = Ref("RayCluster", "ray-cluster", "default")

    def second_group(obj):
        groups = obj["spec"]["workerGroupSpecs"]
        groups.append({**groups[0], "groupName": "eval-group", "replicas": 1})

    kube.edit("rayclusters", ref.name, second_group, namespace=ref.namespace)
    api = KubeApi(client.ApiClient(client.Configuration(host=kube.url)))
    read = api.get

    def read_then_someone_reorders(target):
        seen = read(target)
        kube.edit("rayclusters", ref.name, lambda obj: obj["spec"]["workerGroupSpecs"].reverse(),
                  namespace=ref.namespace)
        return seen

    api.get = read_then_someone_reorders
    with pytest.raises(KubeError) as refused:
        api.set_worker_replicas(ref, {"gpu-pool": 0})
    assert refused.value.code == 422
    groups = kube.get("rayclusters", ref.name, ref.namespace)["spec"]["workerGroupSpecs"]
    assert {g["groupName"]: g["replicas"] for g in groups} == {"eval-group": 1, "gpu-pool": 2}


@pytest.mark.parametrize("kuberay, who", [("v1.7.0", "KubeRay's upgradeStrategy Recreate"),
                                          ("v1.5.2", "this KubeRay has no upgradeStrategy (before v1.6)")])
def test_a_new_image_reaches_every_pod_whatever_the_kuberay_and_the_next_plan_is_clean(fakes, specs, capsys,
                                                                                      kuberay, who):
    """KubeRay never changes a running pod; v1.6+ recreates them all under upgradeStrategy Recreate, an older
    one's CRD drops the field and rlops deletes the pods for KubeRay to make again (no Ray job runs here:
    the fake head's dashboard lists none)."""
    gcp, kube = fakes
    kube.kuberay = kuberay
    assert cli.main(["apply", "--yes", "h200"]) == 0
    stored = kube.get("rayclusters", "ray-cluster", "default")["spec"]
    assert ("upgradeStrategy" in stored) == (kuberay == "v1.7.0"), "the fake did not play this KubeRay's CRD"
    before = {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")}
    assert len(before) == 3 and all(_images(pod) == {PULLED["v0.5.0"]} for pod in kube.pods("ray-cluster"))

    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("image: nvcr.io/nvidia/nemo-rl:v0.5.0",
                                          "image: nvcr.io/nvidia/nemo-rl:v0.5.1"))
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    planned = capsys.readouterr().out
    assert f"every pod restarts ({who}" in planned if kuberay == "v1.7.0" else f"every pod restarts: {who}" in planned
    assert cli.main(["apply", "--yes", "h200"]) == 0
    out = capsys.readouterr().out
    assert ("recreating the 3 pods of RayCluster/default/ray-cluster" in out) == (kuberay == "v1.5.2")
    pods = kube.pods("ray-cluster")
    assert len(pods) == 3 and not before & {pod["metadata"]["name"] for pod in pods}
    assert all(_images(pod) == {PULLED["v0.5.1"]} for pod in pods)
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out


# h200's image as its pods pull it: through the project's Artifact Registry cache of nvcr.io (ray.image_cache).
PULLED = {tag: cached(f"nvcr.io/nvidia/nemo-rl:{tag}", "rlops-h200-example", "us-central1")
          for tag in ("v0.5.0", "v0.5.1")}


def _images(pod: dict) -> set[str]:
    spec = pod["spec"]
    return {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}


def test_readiness_names_the_pods_still_on_an_older_template(fakes, capsys):
    """An older KubeRay keeps running pods when the template changes behind rlops's back (a console edit of
    a pod annotation rlops owns): apply restores the template, and readiness waits for pods made from it."""
    from rlops.kube import readiness

    gcp, kube = fakes
    kube.kuberay = "v1.5.2"
    assert cli.main(["apply", "--yes", "h200"]) == 0
    cluster = kube.get("rayclusters", "ray-cluster", "default")
    pods = kube.pods("ray-cluster")
    assert readiness.pods_current(cluster, pods).ready

    def stamp(obj):
        obj["spec"]["headGroupSpec"]["template"]["metadata"]["annotations"]["rlops-pod-template"] = "edited"

    kube.edit("rayclusters", "ray-cluster", stamp, namespace="default")
    edited = kube.get("rayclusters", "ray-cluster", "default")
    current = readiness.pods_current(edited, kube.pods("ray-cluster"))
    assert not current.ready and current.what.startswith("3 of 3 pods still run an older template")


def test_a_namespace_of_its_own_is_applied_first_never_pruned_and_deleted_by_destroy(fakes, specs, capsys):
    from render_support import in_namespace_ray

    gcp, kube = fakes
    in_namespace_ray(specs)
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    patches = [r.path for r in kube.writes() if r.method == "PATCH"]
    assert patches[0] == "/api/v1/namespaces/ray", patches[:3]
    assert kube.get("namespaces", "ray")["metadata"]["labels"]["rlops-env"] == "h200"
    for plural, name in [("serviceaccounts", "generic-ksa"), ("secrets", "ray-cluster-tokens"),
                         ("persistentvolumeclaims", "rl-lustre-pvc"), ("rayclusters", "ray-cluster")]:
        assert kube.get(plural, name, "ray") is not None and kube.get(plural, name, "default") is None, plural
    assert len(kube.pods("ray-cluster", "ray")) == 3, "KubeRay's pods did not pass admission"
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out

    # Back to default: rlops's objects in ray are pruned, the namespace is not (deleting it deletes all in it).
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("    namespace: ray\n", "    namespace: default\n")
                    .replace("  cluster_name: ray-cluster\n  namespace: ray\n", "  cluster_name: ray-cluster\n"))
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    planned = capsys.readouterr().out
    assert "- RayCluster/ray/ray-cluster" in planned and "Namespace" not in planned, planned
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    assert kube.get("rayclusters", "ray-cluster", "ray") is None and kube.get("rayclusters", "ray-cluster", "default")
    assert kube.get("namespaces", "ray") is not None
    assert cli.main(["destroy", "h200", "--yes"]) == 0
    deletes = [r.path for r in kube.writes() if r.method == "DELETE"]
    assert deletes[-1] == "/api/v1/namespaces/ray", deletes
    assert kube.get("namespaces", "ray") is None


def test_the_fake_api_server_refuses_a_missing_namespace_404_and_a_terminating_one_403(fakes):
    """NamespaceLifecycle admission, through the official client: what a real API server answers."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    gcp, kube = fakes
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=kube.url)))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tokens"}, "data": {}}
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_secret("ray", secret)
    status = json.loads(missing.value.body)
    assert (missing.value.status, status["reason"]) == (404, "NotFound")
    assert status["message"] == 'namespaces "ray" not found'
    assert status["details"] == {"name": "ray", "kind": "namespaces"}
    with pytest.raises(ApiException) as dry:
        core.create_namespaced_secret("ray", secret, dry_run="All")
    assert dry.value.status == 404

    # A namespace's objects go with it; then the namespace goes.
    core.create_namespace({"metadata": {"name": "ray"}})
    assert core.read_namespace("ray").status.phase == "Active"
    core.create_namespaced_secret("ray", secret)
    core.delete_namespace("ray")
    assert kube.get("secrets", "tokens", "ray") is None and kube.get("namespaces", "ray") is None

    # Held Terminating by someone's finalizer: nothing new may be created in it.
    core.create_namespace({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    core.create_namespaced_secret("held", secret)
    core.delete_namespace("held")
    assert core.read_namespace("held").status.phase == "Terminating"
    with pytest.raises(ApiException) as terminating:
        core.create_namespaced_secret("held", {**secret, "metadata": {"name": "more"}})
    status = json.loads(terminating.value.body)
    assert (terminating.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == ('secrets "more" is forbidden: unable to create new content in namespace held because '
                                 "it is being terminated")
    assert status["details"]["causes"][0]["reason"] == "NamespaceTerminating"
    assert kube.get("secrets", "tokens", "held") is None  # its content is gone all the same

    for name in kube_rules.BUILT_IN_NAMESPACES:
        assert core.read_namespace(name).status.phase == "Active"
    with pytest.raises(ApiException) as immortal:
        core.delete_namespace("default")
    assert immortal.value.status == 403 and "this namespace may not be deleted" in immortal.value.body


def _applied_then_pods_without_their_account(kube):
    """h200 applied, then its ServiceAccount deleted and its pods with it: KubeRay can make none (admission)."""
    from kubernetes import client

    from rlops.kube.cluster import KubeApi
    from rlops.kube.objects import Ref

    assert cli.main(["apply", "--yes", "h200"]) == 0
    api = KubeApi(client.ApiClient(client.Configuration(host=kube.url)))
    api.delete(Ref("ServiceAccount", "generic-ksa", "default"))
    for pod in kube.pods("ray-cluster"):
        api.delete(Ref("Pod", pod["metadata"]["name"], "default"))
    assert kube.pods("ray-cluster") == []
    return api


def test_kuberay_makes_no_pod_whose_service_account_is_missing_and_says_why_in_an_event(fakes, capsys):
    """ServiceAccount admission refuses the pod's create; KubeRay records FailedToCreateHeadPod on the RayCluster
    and tries again later, and the pods come once the account is back."""
    from kubernetes import client

    gcp, kube = fakes
    api = _applied_then_pods_without_their_account(kube)
    events = client.CoreV1Api(api.api).list_namespaced_event("default", field_selector="involvedObject.kind=RayCluster")
    (event,) = [e for e in events.items if e.involved_object.name == "ray-cluster"]
    assert (event.type, event.reason) == ("Warning", "FailedToCreateHeadPod")
    assert event.message.startswith("Failed to create head Pod default/ray-cluster-head-")
    assert event.message.endswith('is forbidden: error looking up service account default/generic-ksa: '
                                  'serviceaccount "generic-ksa" not found'), event.message
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    assert len(kube.pods("ray-cluster")) == 3


def test_a_namespace_made_by_hand_is_used_as_it_is_neither_taken_over_nor_deleted(fakes, specs):
    from render_support import in_namespace_ray

    gcp, kube = fakes
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ray", "labels": {"team": "ml"}}},
             "namespaces")
    in_namespace_ray(specs)
    assert cli.main(["apply", "--yes", "h200"]) == 0
    assert kube.get("rayclusters", "ray-cluster", "ray") is not None
    assert not [r for r in kube.writes() if r.path.endswith("/namespaces/ray")]
    assert cli.main(["destroy", "h200", "--yes"]) == 0
    assert kube.get("namespaces", "ray")["metadata"]["labels"] == {"team": "ml", "kubernetes.io/metadata.name": "ray"}


def _new_image(specs) -> None:
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("image: nvcr.io/nvidia/nemo-rl:v0.5.0",
                                          "image: nvcr.io/nvidia/nemo-rl:v0.5.1"))


def _head_image(kube) -> str:
    return kube.get("rayclusters", "ray-cluster", "default")["spec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["image"]


@pytest.mark.parametrize("cluster_ip_service, answered", [
    (True, '503 no endpoints available for service "ray-cluster-head-svc"'),
    (False, "503 error trying to reach service: dial tcp 10.8.0.10:8265: connect: connection refused")])
def test_a_head_that_does_not_say_which_jobs_run_holds_a_template_change_until_it_says_none(
        fakes, specs, capsys, cluster_ip_service, answered):
    """The head pod runs (a job may be on it) but fails its readiness probe. Behind a ClusterIP head service the
    API server's proxy has no endpoint for it (503 "no endpoints available"); behind KubeRay's headless one
    (v1.2+, not-ready addresses published) it reaches the pod, whose dashboard does not answer. Either way not
    knowing is not "no jobs": the change is held, and made once the head answers that none runs."""
    gcp, kube = fakes
    kube.head_service_cluster_ip = cluster_ip_service
    assert cli.main(["apply", "--yes", "h200"]) == 0
    pods = {p["metadata"]["name"] for p in kube.pods("ray-cluster")}
    kube.unready_heads.add(("default", "ray-cluster"))
    _new_image(specs)
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200"]) == 1
    err = capsys.readouterr().err
    assert "held, not applied: RayCluster/default/ray-cluster (spec.headGroupSpec.template" in err, err
    assert f"the Ray head did not answer which jobs run ({answered}) while its pod ray-cluster-head-" in err, err
    assert "held as if a job ran" in err and "run apply again once the Ray head answers" in err, err
    assert [r for r in kube.requests if r.path == "/api/v1/namespaces/default/services/ray-cluster-head-svc:dashboard"
                                                    "/proxy/api/jobs/"]
    assert _head_image(kube) == PULLED["v0.5.0"]
    assert {p["metadata"]["name"] for p in kube.pods("ray-cluster")} == pods

    kube.unready_heads.clear()  # the probe passes again; the head's dashboard lists no job
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    after = kube.pods("ray-cluster")
    assert len(after) == 3 and not pods & {p["metadata"]["name"] for p in after}
    assert all(_images(pod) == {PULLED["v0.5.1"]} for pod in after)


def test_a_head_that_does_not_run_holds_nothing_as_no_job_can_run_without_it(fakes, specs, capsys):
    """With its ServiceAccount gone KubeRay cannot make the head pod (admission refuses it): the proxy has no
    endpoint (503) and no head pod runs, so no Ray job can. The change goes ahead; holding it would keep a
    cluster whose head cannot start from ever getting the template that fixes it."""
    gcp, kube = fakes
    _applied_then_pods_without_their_account(kube)
    _new_image(specs)
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    assert ('the Ray head did not answer which jobs run (503 no endpoints available for service '
            '"ray-cluster-head-svc"), and no head pod runs: no Ray job can run') in capsys.readouterr().out
    pods = kube.pods("ray-cluster")
    assert len(pods) == 3 and all(_images(pod) == {PULLED["v0.5.1"]} for pod in pods)


def test_a_replacement_of_the_ray_cluster_is_held_while_a_job_runs_and_made_after_it(fakes, specs, capsys):
    """A replaced Lustre instance has a new address: the PV, its claim and the RayCluster that mounts it are
    deleted and created again, which ends every pod as a template change does. While the head lists a running
    job none of the three is touched (the claim cannot go while the pods mount it, nor the volume while the
    claim is bound to it); the first apply after the job ends replaces them."""
    from fakes.jsonhttp import JsonServer, reply

    gcp, kube = fakes
    jobs = [{"submission_id": "rlops.h200.long-run.1", "job_id": "02000000", "status": "RUNNING"}]

    def dashboard(http):  # Ray's GET /api/jobs/: every job the head knows, as a JSON list
        reply(http, *((200, jobs) if http.path == "/api/jobs/" else (404, {})))

    server = JsonServer(dashboard, "fake-ray-dashboard")
    try:
        assert cli.main(["apply", "--yes", "h200"]) == 0
        kube.services[("default", "ray-cluster-head-svc:dashboard")] = server.url
        uid = kube.get("rayclusters", "ray-cluster", "default")["metadata"]["uid"]
        pods = {p["metadata"]["name"] for p in kube.pods("ray-cluster")}
        first_ip = kube.get("persistentvolumes", "rl-lustre-pv")["spec"]["csi"]["volumeAttributes"]["ip"]
        spec = specs / "h200.yaml"
        spec.write_text(spec.read_text().replace("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 250")
                        .replace("capacity_gib: 18000", "capacity_gib: 36000")
                        .replace("deletion_policy: retain", "deletion_policy: delete"))
        capsys.readouterr()
        assert cli.main(["apply", "--yes", "h200", "--delete-data", "--ready-timeout", "20"]) == 1
        err = capsys.readouterr().err
        assert "held, not applied: RayCluster/default/ray-cluster would be deleted and created again, every pod " \
               "with it" in err, err
        assert "with it, the replacement of PersistentVolumeClaim/default/rl-lustre-pvc" in err, err
        assert "with it, the replacement of PersistentVolume/rl-lustre-pv (the server cannot change it in place" in err
        assert "Ray job(s) rlops.h200.long-run.1 pending or running" in err, err
        assert kube.get("rayclusters", "ray-cluster", "default")["metadata"]["uid"] == uid
        assert {p["metadata"]["name"] for p in kube.pods("ray-cluster")} == pods
        assert kube.get("persistentvolumes", "rl-lustre-pv")["spec"]["csi"]["volumeAttributes"]["ip"] == first_ip
        assert not [r for r in kube.writes() if r.method == "DELETE" and "lustre" in r.path]

        jobs[0]["status"] = "SUCCEEDED"
        assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
        assert kube.get("rayclusters", "ray-cluster", "default")["metadata"]["uid"] != uid
        assert kube.get("persistentvolumes", "rl-lustre-pv")["spec"]["csi"]["volumeAttributes"]["ip"] != first_ip
        assert not pods & {p["metadata"]["name"] for p in kube.pods("ray-cluster")}
    finally:
        server.stop()


@pytest.mark.servers
def test_only_a_list_of_jobs_says_which_jobs_run(tmp_path):
    """Ray's GET /api/jobs/ answers a JSON list; every other answer is `JobsUnknown`, saying what came."""
    import socket
    import threading

    from fakes.jsonhttp import JsonServer
    from rlops.cloud.ray_jobs import JobsUnknown, active_jobs

    answers = {
        "/listed": (200, b'[{"submission_id": "a", "status": "RUNNING"}, {"submission_id": "b", '
                         b'"status": "SUCCEEDED"}, {"submission_id": null, "job_id": "c", "status": "PENDING"}]'),
        "/html": (200, b"<html><body>upstream connect error</body></html>"),
        "/object": (200, b'{"detail": "Not Found"}'),
        "/status": (503, json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                     "message": 'no endpoints available for service "x-head-svc"',
                                     "reason": "ServiceUnavailable", "code": 503}).encode()),
        "/error": (500, b"500 Internal Server Error\n\nServer got itself in trouble"),
    }
    release = threading.Event()

    def serve(http):
        if http.path.startswith("/slow"):
            release.wait(5)
        status, body = answers.get(http.path.removesuffix("/api/jobs/"), (200, b"[]"))
        http.send_response(status)
        http.send_header("Content-Length", str(len(body)))
        http.end_headers()
        http.wfile.write(body)

    server = JsonServer(serve, "fake-dashboard-answers")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}"
    try:
        assert active_jobs(server.url + "/listed") == ["a", "c"]
        assert active_jobs(server.url + "/empty") == []
        for path, said in [("/html", "200, but not a list of jobs: <html><body>upstream connect error</body></html>"),
                           ("/object", '200, but not a list of jobs: {"detail": "Not Found"}'),
                           ("/status", '503 no endpoints available for service "x-head-svc"'),
                           ("/error", "500 500 Internal Server Error Server got itself in trouble")]:
            with pytest.raises(JobsUnknown) as unknown:
                active_jobs(server.url + path)
            assert str(unknown.value) == said
        with pytest.raises(JobsUnknown, match="no answer: timed out"):
            active_jobs(server.url + "/slow", timeout=0.2)
        with pytest.raises(JobsUnknown, match="no answer: .*(refused|Connection)"):
            active_jobs(refused)
    finally:
        release.set()
        server.stop()


@pytest.mark.parametrize("client_behind", [0, 58])
def test_a_token_that_expires_while_apply_waits_is_refreshed_and_the_apply_completes(fakes, monkeypatch, capsys,
                                                                                   client_behind):
    """The API server accepts a Google access token for an hour by its clock, then answers 401. Each pause of
    apply's waits stands for half an hour on that clock (a slow add-on, slow nodes), so the token of the
    first request runs out while apply waits. It is refreshed before it expires; with our clock 58 minutes
    behind the server's it is sent expired, refused (401) and sent again once refreshed."""
    import datetime
    import time
    import types

    import google.oauth2.credentials
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from rlops.kube import cluster, sync

    gcp, kube = fakes
    kube.controller_delay = 0.5  # at least four pauses before anything is ready: two hours on the server's clock
    clock = {"now": datetime.datetime.now(datetime.UTC).replace(tzinfo=None)}
    kube.clock = lambda: clock["now"]
    kube.issue_token()  # from now on every request needs a token

    # What the API server answers a token it does not accept: 401 in its Status shape, through the official client.
    stranger = client.Configuration(host=kube.url, api_key={"authorization": "ya29.unknown"},
                                    api_key_prefix={"authorization": "Bearer"})
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(client.ApiClient(stranger)).list_namespace()
    assert refused.value.status == 401
    assert json.loads(refused.value.body) == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                              "status": "Failure", "message": "Unauthorized",
                                              "reason": "Unauthorized", "code": 401}

    # google-auth's own credentials, whose refresh asks the fake for a token (its token endpoint, as it were).
    credentials = google.oauth2.credentials.Credentials(token=None,
                                                        refresh_handler=lambda request, scopes: kube.issue_token())
    token = cluster.BearerToken(credentials, now=lambda: clock["now"] - datetime.timedelta(minutes=client_behind))
    monkeypatch.setattr(cluster, "access", lambda dns_endpoint, endpoints: (kube.url, token))

    def pause(seconds: float) -> None:
        clock["now"] += datetime.timedelta(minutes=30)
        time.sleep(seconds)

    monkeypatch.setattr(sync, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=pause))

    assert cli.main(["apply", "--yes", "h200"]) == 0, capsys.readouterr().err
    requests = [r for r in kube.requests if r.token != "ya29.unknown"]
    written = next(i for i, r in enumerate(requests) if r.method == "PATCH" and r.query.get("dryRun") != "All"
                   and r.path.endswith("/rayclusters/ray-cluster"))
    fetched_while_waiting = {r.token for r in requests[written:]} - {r.token for r in requests[:written]}
    assert fetched_while_waiting, "no token was fetched while apply waited"
    unauthorized = [i for i, r in enumerate(requests) if r.status == 401]
    if client_behind:
        assert unauthorized, "the server never refused a token"
        for i in unauthorized:  # the same request again, with another token, accepted
            again = requests[i + 1]
            assert (again.method, again.path) == (requests[i].method, requests[i].path)
            assert again.token != requests[i].token and again.status != 401
    else:
        assert not unauthorized, [(requests[i].method, requests[i].path) for i in unauthorized]


# -- KubeRay's status rules per version line (fakes.kuberay): readiness and recreation from the pods ----------------

KUBERAY_LINES = ["v1.2.2", "v1.5.2", "v1.6.0", "v1.7.0"]


def _ray_cluster(kube, name="ray-cluster") -> dict:
    return kube.get("rayclusters", name, "default")


@pytest.mark.parametrize("kuberay", KUBERAY_LINES)
def test_a_template_change_reaches_ready_on_every_kuberay_line_without_hanging(fakes, specs, capsys, kuberay):
    """Before v1.6 rlops deletes the pods (KubeRay, which writes no status for a template change, leaves them);
    from v1.6 KubeRay's Recreate does. Either way apply is done in seconds, not after --ready-timeout."""
    gcp, kube = fakes
    kube.kuberay = kuberay
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    before = {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")}
    _new_image(specs)
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    by_rlops = kuberay < "v1.6"
    assert ("recreating the 3 pods of RayCluster/default/ray-cluster on an older template (this KubeRay has no "
            "upgradeStrategy" in out) == by_rlops, out
    assert ("KubeRay recreates the pods of RayCluster/default/ray-cluster" in out) == (not by_rlops), out
    assert "ready: RayCluster/default/ray-cluster (head ready, 2 of 2 workers ready" in out, out
    pods = kube.pods("ray-cluster")
    assert len(pods) == 3 and not before & {pod["metadata"]["name"] for pod in pods}
    assert all(_images(pod) == {PULLED["v0.5.1"]} for pod in pods)
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("kuberay", KUBERAY_LINES)
def test_a_tolerations_only_change_reaches_ready_though_kuberay_writes_no_status_for_it(fakes, capsys, kuberay):
    """A console edit of the workers' tolerations (a field rlops owns): apply puts them back. The pods' template
    (and their digest) does not change, so no pod moves, and KubeRay writes no status: observedGeneration stays
    behind the generation for good (consistency.go), which readiness does not wait for."""
    gcp, kube = fakes
    kube.kuberay = kuberay
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    pods = {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")}

    def tolerate(obj):
        obj["spec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"].append(
            {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"})

    kube.edit("rayclusters", "ray-cluster", tolerate, namespace="default")
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    planned = capsys.readouterr().out
    assert "tolerations" in planned and "every pod restarts" not in planned, planned
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "3"]) == 0, capsys.readouterr().err
    cluster = _ray_cluster(kube)
    assert cluster["status"]["observedGeneration"] < cluster["metadata"]["generation"], \
        "the fake wrote a status for a change that moved nothing"
    assert {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")} == pods


def test_an_upgrade_strategy_only_change_reaches_ready_and_restarts_nothing(fakes, capsys):
    """A RayCluster applied before rlops rendered `upgradeStrategy` (or by an older KubeRay's CRD, which dropped
    it): adding it is a spec change KubeRay's hash leaves out, so nothing is recreated and no status is written."""
    gcp, kube = fakes
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    pods = {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")}
    kube.edit("rayclusters", "ray-cluster", lambda obj: obj["spec"].pop("upgradeStrategy"), namespace="default")
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    planned = capsys.readouterr().out
    assert "~ RayCluster/default/ray-cluster  (spec.upgradeStrategy)" in planned, planned
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "3"]) == 0, capsys.readouterr().err
    cluster = _ray_cluster(kube)
    assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    assert cluster["status"]["observedGeneration"] < cluster["metadata"]["generation"]
    assert {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")} == pods


@pytest.mark.parametrize("before, cause", [
    ("v1.5.2", "the head pod ray-cluster-head-"),
    ("v1.6.0", "the Ray operator was upgraded (ray.io/kuberay-version v1.6.0 -> v1.7.0)")])
def test_a_template_change_after_an_add_on_upgrade_across_v1_6_reaches_ready(fakes, specs, capsys, before, cause):
    """The plan says KubeRay recreates (the CRD now has upgradeStrategy), but KubeRay does not: a head pod made
    before v1.6 has no recreate hash, and one made by v1.6.0 gets v1.7.0's stamp (and the new spec's hash) on the
    new operator's first reconcile, which here comes after rlops's write (the add-on upgraded while apply runs).
    rlops sees the pods stay on the old template and deletes them itself."""
    gcp, kube = fakes
    kube.kuberay = before
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    old = {pod["metadata"]["name"] for pod in kube.pods("ray-cluster")}
    if before == "v1.5.2":
        kube.kuberay = "v1.7.0"
    else:
        kube.kuberay_pending = "v1.7.0"
    _new_image(specs)
    capsys.readouterr()
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "every pod restarts (KubeRay's upgradeStrategy Recreate" in out, out
    assert "recreating the 3 pods of RayCluster/default/ray-cluster on an older template (" + cause in out, out
    pods = kube.pods("ray-cluster")
    assert len(pods) == 3 and not old & {pod["metadata"]["name"] for pod in pods}
    assert all(_images(pod) == {PULLED["v0.5.1"]} for pod in pods)
    assert pods[0]["metadata"]["annotations"]["ray.io/kuberay-version"] == "v1.7.0"
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("kuberay", KUBERAY_LINES)
def test_a_worker_running_but_not_ready_is_not_counted_ready(fakes, specs, capsys, kuberay):
    """Raylets still starting: the worker pods run, their readiness probes fail. KubeRay's availableWorkerReplicas
    counts them (Running), readyWorkerReplicas (from v1.2) does not, and neither does rlops."""
    gcp, kube = fakes
    kube.kuberay = kuberay
    spec = specs / "h200.yaml"
    spec.write_text(spec.read_text().replace("autoscaling: {min_nodes: 0, max_nodes: 2}",
                                             "autoscaling: {min_nodes: 2, max_nodes: 2}")
                    .replace("scale_down: [ray-workers, node-pools]", "scale_down: [ray-workers]"))
    kube.unready_workers.add(("default", "ray-cluster"))
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "RayCluster/default/ray-cluster not ready after 1s: head ready, 0 of 2 workers ready, 2 needed (2 " \
           "running, not Ready yet)" in err, err
    status = _ray_cluster(kube)["status"]
    assert status["availableWorkerReplicas"] == 2 and "readyWorkerReplicas" not in status  # omitempty
    kube.unready_workers.clear()
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    assert "head ready, 2 of 2 workers ready, 2 needed" in capsys.readouterr().out
    if kuberay >= "v1.2":
        assert _ray_cluster(kube)["status"]["readyWorkerReplicas"] == 2


def test_kuberay_1_2_spot_shortfall_is_ready_with_the_head_and_the_workers_that_run(fakes, capsys):
    """KubeRay 1.2 says `state: ready` only once every pod runs (CheckAllPodsRunning) and has no conditions:
    three Spot nodes of eight never make it ready. rlops asks the pods: the head ready and each pool's
    min_nodes workers ready (b200-spot: 0), so apply is done with the three it has."""
    gcp, kube = fakes
    kube.kuberay = "v1.2.2"
    kube.grant_gpu_nodes(3)
    assert cli.main(["apply", "--yes", "b200-spot", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    assert "ready: RayCluster/default/ray-a4-gpu-spot (head ready, 3 of 8 workers ready, 0 needed; 9 pods" in \
        capsys.readouterr().out
    status = _ray_cluster(kube, "ray-a4-gpu-spot")["status"]
    assert "state" not in status and "conditions" not in status, status
    assert (status["readyWorkerReplicas"], status["desiredWorkerReplicas"]) == (3, 8)


def test_a_rerun_after_a_stopped_recreation_finishes_it_with_no_spec_change_left(fakes, specs, capsys, monkeypatch):
    """Before v1.6: the new template is applied, then the apply stops before the pods are recreated. The spec
    matches, but the pods carry the old template's digest: the plan says so and the next apply recreates them."""
    from rlops.kube import cluster, sync

    gcp, kube = fakes
    kube.kuberay = "v1.5.2"
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    _new_image(specs)

    def stopped(*args, **kwargs):
        raise cluster.KubeError("stopped (the build was cancelled)")

    with monkeypatch.context() as patched:
        patched.setattr(sync, "_recreate_pods", stopped)
        assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 1
    assert _head_image(kube) == PULLED["v0.5.1"]
    assert all(_images(pod) == {PULLED["v0.5.0"]} for pod in kube.pods("ray-cluster"))
    capsys.readouterr()
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 2
    planned = capsys.readouterr().out
    assert "~ RayCluster/default/ray-cluster  (3 pods on an older template (ray-cluster-" in planned, planned
    assert "rlops deletes the pods on an older template" in planned, planned
    assert cli.main(["apply", "--yes", "h200", "--ready-timeout", "5"]) == 0, capsys.readouterr().err
    assert "an earlier apply stopped before they were recreated" in capsys.readouterr().out
    assert all(_images(pod) == {PULLED["v0.5.1"]} for pod in kube.pods("ray-cluster"))
    assert cli.main(["plan", "h200", "--detailed-exitcode"]) == 0, capsys.readouterr().out
