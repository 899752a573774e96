"""The in-cluster objects of an environment, rendered from the spec and the live cloud state. No I/O but
reading the base objects in `manifests/`, which are filled as data (dicts), never as text.

What the seeds got wrong and this fixes (seed-inventory §4): the multi-NIC annotations sit on the
worker pod template (G1); no apt/uv start script and no `git pull` (G2, G8); the accelerator's own
node selector and NCCL tuner file (G3); workers wait for the gIB installer (G9); the Lustre PV
handle is PROJECT/ZONE/INSTANCE with an empty storage class (G11, G12); HF_HOME is on Lustre (G13).
Tokens are files of a Secret volume, never in a container's environment (`tokens`).
"""

import base64
import copy
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from rlops.kube import tokens, transports
from rlops.kube.objects import Manifest, as_manifest, spec_of
from rlops.ownership import labels_for
from rlops.spec import catalog
from rlops.spec.field_types import Quantity
from rlops.spec.gcp_sections import GpuPool
from rlops.spec.model import GcpEnvironment

# Package data, so that an installed rlops renders too; `manifests/` at the top of the repository links here.
MANIFESTS = resources.files("rlops.kube") / "manifests"
REDACTED = "<redacted>"
# Until the Lustre instance exists (a plan from nothing, render --offline) its address is not known.
UNKNOWN_LUSTRE_IP = "LUSTRE-IP-KNOWN-AFTER-APPLY"
TEMPLATE_DIGEST = "rlops-pod-template"  # annotation on every pod template and so on every pod
# The namespaces every cluster has: the API server creates them and keeps them (its system namespaces
# controller; NamespaceLifecycle refuses to delete default, kube-system and kube-public). rlops renders none.
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# The kubelet writes a Secret volume's files as root, with the volume's mode; an fsGroup would make them the
# group's and add group read (0440). Pods that run as root with no fsGroup: the files' owner alone reads them.
TOKEN_READER = {"runAsUser": 0, "runAsGroup": 0}


@dataclass(frozen=True)
class LiveFacts:
    """What only the cloud knows: the Lustre instance's address (`10.0.0.2@tcp:/lustrefs` -> 10.0.0.2)."""

    lustre_ip: str

    @classmethod
    def from_mount_point(cls, mount_point: str) -> "LiveFacts":
        return cls(mount_point.split("@", 1)[0])


@cache
def _documents(name: str) -> tuple[Any, ...]:
    return tuple(doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc)


def base(name: str) -> list[Manifest]:
    """Fresh copies of the objects in manifests/NAME."""
    return [as_manifest(doc) for doc in copy.deepcopy(_documents(name))]


def base_part(name: str) -> dict[str, Any]:
    """A fresh copy of manifests/NAME's one document: a part of an object (a worker group, what a GPU transport adds
    to one), not an object."""
    (part,) = copy.deepcopy(_documents(name))
    return part


def secret_name(env: GcpEnvironment) -> str:
    return f"{env.ray.cluster_name}-tokens"


def pvc_name(env: GcpEnvironment) -> str:
    return f"{env.lustre.name}-pvc"


def objects(env_name: str, env: GcpEnvironment, facts: LiveFacts,
            secret_values: dict[str, str] | None = None) -> list[Manifest]:
    """Every object rlops applies to the cluster, in apply order. `secret_values` None: the Secret shows <redacted>."""
    rendered = [*namespace(env), *transports.network_mapping(env, base), *transports.installers(env),
                *lustre_volume(env, facts),
                service_account(env), secret(env, secret_values), ray_cluster(env)]
    for obj in rendered:
        obj["metadata"].setdefault("labels", {}).update(labels_for(env_name))
    return rendered


def namespace(env: GcpEnvironment) -> list[Manifest]:
    """The Ray pods' namespace, unless the cluster has it anyway: an object in a namespace that does not exist
    is refused (404, the NamespaceLifecycle admission). Its service account is in the same one (spec rules)."""
    if env.ray.namespace in BUILT_IN_NAMESPACES:
        return []
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": env.ray.namespace}}]


def lustre_volume(env: GcpEnvironment, facts: LiveFacts) -> list[Manifest]:
    pv, pvc = base("lustre-volume.yaml")
    capacity = f"{env.lustre.capacity_gib}Gi"
    pv["metadata"]["name"] = f"{env.lustre.name}-pv"
    volume = spec_of(pv)
    volume["capacity"]["storage"] = capacity
    volume["claimRef"] = {"namespace": env.ray.namespace, "name": pvc_name(env)}
    volume["csi"]["volumeHandle"] = f"{env.project.id}/{env.zone}/{env.lustre.name}"
    volume["csi"]["volumeAttributes"] = {"ip": facts.lustre_ip, "filesystem": env.lustre.filesystem}
    pvc["metadata"].update(name=pvc_name(env), namespace=env.ray.namespace)
    claim = spec_of(pvc)
    claim["volumeName"] = pv["metadata"]["name"]
    claim["resources"]["requests"]["storage"] = capacity
    return [pv, pvc]


def service_account(env: GcpEnvironment) -> Manifest:
    (account,) = base("service-account.yaml")
    ksa = env.cluster.service_account
    account["metadata"].update(name=ksa.name, namespace=ksa.namespace)
    if ksa.google_service_account:
        account["metadata"]["annotations"] = {"iam.gke.io/gcp-service-account": ksa.google_service_account}
    return account


def secret(env: GcpEnvironment, values: dict[str, str] | None) -> Manifest:
    """Tokens as `data`, never `stringData`: a key applied through stringData is owned by no field manager,
    so removing it from the spec would leave it in the cluster (kubernetes#108008)."""
    (obj,) = base("secret.yaml")
    obj["metadata"].update(name=secret_name(env), namespace=env.ray.namespace)
    if values is None:
        obj["data"] = {name: REDACTED for name in tokens.names(env.secrets)}
    else:
        files = tokens.files({name: values[name] for name in env.secrets})
        obj["data"] = {name: base64.b64encode(files[name].encode()).decode() for name in sorted(files)}
    return obj


def ray_cluster(env: GcpEnvironment) -> Manifest:
    (cluster,) = base("raycluster.yaml")
    ray, spec = env.ray, spec_of(cluster)
    cluster["metadata"].update(name=ray.cluster_name, namespace=ray.namespace)
    spec["rayVersion"] = ray.ray_version
    head = spec["headGroupSpec"]["template"]["spec"]
    head["serviceAccountName"] = env.cluster.service_account.name
    head["nodeSelector"] = {"cloud.google.com/gke-nodepool": env.cluster.system_pool.name}
    head["securityContext"] = dict(TOKEN_READER)
    container = head["containers"][0]
    container.update(image=env.pulled_image, resources=_resources(ray.head.cpu, ray.head.memory))
    container["env"] = _common_env(env)
    container["volumeMounts"] = [_lustre_mount(env), *_tokens_mount(env)]
    head["volumes"] = [_lustre_volume(env), *_tokens_volume(env)]
    spec["workerGroupSpecs"] = [_worker_group(env, pool) for pool in env.gpu_pools]
    # KubeRay keeps running pods on their old template; from v1.6 Recreate replaces them all when the
    # spec changes (the API server of an older KubeRay drops the field, and rlops recreates them: kube.sync).
    spec["upgradeStrategy"] = {"type": "Recreate"}
    digest = template_digest(cluster)
    for template in pod_templates(cluster):
        template.setdefault("metadata", {}).setdefault("annotations", {})[TEMPLATE_DIGEST] = digest
    return cluster


def pod_templates(ray_cluster: Manifest) -> list[dict[str, Any]]:
    return _templates(spec_of(ray_cluster))


def _templates(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a RayCluster's spec: its head group's, then each worker group's."""
    return [spec["headGroupSpec"]["template"], *(group["template"] for group in spec.get("workerGroupSpecs", []))]


def pods_made_from(ray_cluster: Manifest) -> dict[str, Any]:
    """The part of a RayCluster's spec a change of which makes KubeRay's upgradeStrategy Recreate restart
    every pod: all but the worker counts, tolerations, scheduling gates and the strategy itself
    (GenerateHashWithoutReplicasAndWorkersToDelete, ray-operator/controllers/ray/utils/util.go, v1.7.0)."""
    spec = copy.deepcopy(spec_of(ray_cluster))
    spec.pop("upgradeStrategy", None)
    for group in spec.get("workerGroupSpecs", []):
        for count in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(count, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
    for template in _templates(spec):
        template.get("spec", {}).pop("tolerations", None)
        template.get("spec", {}).pop("schedulingGates", None)
    return spec


def template_digest(ray_cluster: Manifest) -> str:
    """Every pod carries it (KubeRay copies a template's annotations), so readiness can tell a pod made
    from an older spec."""
    return hashlib.sha256(json.dumps(pods_made_from(ray_cluster), sort_keys=True).encode()).hexdigest()[:16]


def _worker_group(env: GcpEnvironment, pool: GpuPool) -> dict[str, Any]:
    group = base_part("ray-worker-group.yaml")
    group.update(groupName=pool.name, replicas=pool.ray_worker_replicas, minReplicas=0,
                 maxReplicas=pool.autoscaling.max_nodes)
    group["rayStartParams"] = {"num-gpus": str(pool.accelerator.count)}
    template = group["template"]
    spec = template["spec"]
    spec["serviceAccountName"] = env.cluster.service_account.name
    spec["securityContext"] = dict(TOKEN_READER)
    spec["nodeSelector"] = {"cloud.google.com/gke-accelerator": pool.accelerator.type,
                            "cloud.google.com/gke-nodepool": pool.name}
    arch = catalog.GPU_MACHINES[pool.machine_type].arch
    if arch != "amd64":
        # GKE taints Arm nodes kubernetes.io/arch=arm64:NoSchedule; a pod that selects arm64, as the upstream A4X
        # pods do, may go there (cloud.google.com/kubernetes-engine/docs/how-to/prepare-arm-workloads-for-deployment).
        spec["nodeSelector"]["kubernetes.io/arch"] = arch
        spec["tolerations"].append({"key": "kubernetes.io/arch", "operator": "Equal", "value": arch,
                                    "effect": "NoSchedule"})
    container = spec["containers"][0]
    container.update(image=env.pulled_image,
                     resources=_resources(env.ray.worker.cpu, env.ray.worker.memory, gpus=pool.accelerator.count))
    transports.add_to_worker(env, pool, group, base_part)
    container["env"] += _common_env(env)
    container["volumeMounts"] += [_lustre_mount(env), *_tokens_mount(env)]
    shm = next(v for v in spec["volumes"] if v["name"] == "shared-memory")
    shm["emptyDir"]["sizeLimit"] = str(env.ray.shm_size)
    spec["volumes"] += [_lustre_volume(env), *_tokens_volume(env)]
    return group


def actor_env(env: GcpEnvironment, pool_name: str | None) -> dict[str, str]:
    """The settings of pool `pool_name`'s GPU workers (the only pool's, for None): gIB's LD_LIBRARY_PATH, NCCL's,
    HF_HOME; for a NeMo RL job's runtime env. `init_ray` copies the driver's environment into every actor, so a
    driver on the head would give the GPU actors the head's LD_LIBRARY_PATH, without gIB's plugin, beside
    NCCL_NET=gIB. The token files' paths stay each node's own: a job says nothing of tokens."""
    pool = next(pool for pool in env.gpu_pools if pool_name in (None, pool.name))
    hidden = tokens.pointers(tokens.DIRECTORY, env.secrets)
    return {e["name"]: e["value"] for e in _worker_group(env, pool)["template"]["spec"]["containers"][0]["env"]
            if "value" in e and e["name"] not in hidden}


def _resources(cpu: Quantity, memory: Quantity, gpus: int = 0) -> dict[str, dict[str, str]]:
    amounts = {"cpu": str(cpu), "memory": str(memory)}
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _common_env(env: GcpEnvironment) -> list[dict[str, str]]:
    # HF_HOME on Lustre: one model download for every node (G13).
    pointers = tokens.pointers(tokens.DIRECTORY, env.secrets)
    return [{"name": "HF_HOME", "value": f"{env.ray.lustre_mount}/huggingface_cache"},
            *({"name": name, "value": value} for name, value in pointers.items())]


def _tokens_mount(env: GcpEnvironment) -> list[dict[str, Any]]:
    return [{"name": "tokens", "mountPath": tokens.DIRECTORY, "readOnly": True}] if env.secrets else []


def _tokens_volume(env: GcpEnvironment) -> list[dict[str, Any]]:
    return [{"name": "tokens", "secret": {"secretName": secret_name(env), "defaultMode": 0o400}}] if env.secrets else []


def _lustre_mount(env: GcpEnvironment) -> dict[str, str]:
    return {"name": "lustre", "mountPath": env.ray.lustre_mount}


def _lustre_volume(env: GcpEnvironment) -> dict[str, Any]:
    return {"name": "lustre", "persistentVolumeClaim": {"claimName": pvc_name(env)}}


def as_yaml(rendered: list[Manifest]) -> str:
    """One multi-document stream, as `kubectl apply -f -` takes it."""
    return yaml.safe_dump_all(rendered, sort_keys=False, default_flow_style=False)
