"""Each GPU family's network stack in the cluster: the pod networks of its GPU NICs, the DaemonSets that put its
NCCL plugin on the nodes, and what its Ray workers add (interfaces, sidecar, volumes, NCCL settings). No I/O but
reading the base objects: GPUDirect-TCPX(O) and the installers come from the GPU catalog's verbatim copies of
GoogleCloudPlatform/container-engine-accelerators (`rlops.spec.catalog.upstream`), changed only as SUBSTITUTIONS
says; GPUDirect-RDMA's worker parts are rlops's own (manifests/worker-rdma.yaml), as the seeds set them up.

Per family, as GKE documents it:
- GPUDirect-RDMA (A3 Ultra, A4, A4X): a gVNIC NIC and one RDMA NIC per GPU, Networks `gvnic-1` and `rdma-N`
  (cloud.google.com/ai-hypercomputer/docs/create/gke-ai-hypercompute-custom).
- GPUDirect-TCPX (A3 High, 4 NICs) and -TCPXO (A3 Mega, 8 NICs): a NetDevice Network `vpcN` per GPU NIC, the NRI
  device injector, the plugin installer, and the `tcpx-daemon` / `tcpxo-daemon` sidecar in every GPU pod
  (cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx).
- A2: nothing; NCCL uses the primary NIC.
"""

import copy
import json
import re
from collections.abc import Callable
from typing import Any

from rlops.kube.objects import Manifest, as_manifest, spec_of
from rlops.spec import catalog
from rlops.spec.gcp_sections import GpuPool
from rlops.spec.model import GcpEnvironment

# What rlops changes in the upstream objects, and why; tests/kube/test_gpu_transports.py allows exactly these.
SUBSTITUTIONS = {
    "installer node affinity": "the accelerators of the spec's GPU pools, not every accelerator the plugin serves",
    "installer image": "ray.nccl_installer_image, when the spec sets one",
    "sidecar as a native sidecar": "the daemon is an init container with restartPolicy: Always, so it ends with the "
                                   "Ray worker (gpudirect-tcpxo/best-practice.md, 'Automatic Sidecar Termination')",
    "TCPX socket at /run/tcpx": "the upstream test mounts the daemon's socket at /tmp, where Ray keeps its session; "
                                "the worker mounts it at /run/tcpx and says so in "
                                "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX, as GKE's TCPX page does",
    "no test scripts": "the upstream test pod's nccl-configmap volume holds its benchmark scripts, not settings",
    "shared memory": "/dev/shm is the spec's ray.shm_size, not the test's 1Gi",
    "labels": "rlops's ownership labels on every object",
}
# The upstream test's mpirun settings a Ray worker does not take from there: its workload container's env sets it.
_NOT_NCCL = {"LD_LIBRARY_PATH"}
TCPX_SOCKET = "/run/tcpx"


def _nics(env: GcpEnvironment) -> list[tuple[str, str, str, str]]:
    """(Network name, VPC, subnet, device mode) per extra NIC, in NIC order (eth1, eth2, ...)."""
    nets = env.networks
    # A valid spec has both gvnic and rdma or neither (spec.rules.gpu_networks).
    if nets.rdma is not None and nets.gvnic is not None:  # gvnic-1, then rdma-0..7: the names Cluster Toolkit uses too
        return [("gvnic-1", f"{nets.gvnic.prefix}-net", f"{nets.gvnic.prefix}-sub", "NetDevice")] + [
            (f"rdma-{i}", f"{nets.rdma.prefix}-net", f"{nets.rdma.prefix}-sub-{i}", "RDMA")
            for i in range(len(nets.rdma.subnet_cidrs))]
    if nets.gpu_nics is not None:  # vpc1..vpcN, the names of GKE's TCPX(O) page and of the upstream pods
        prefix = nets.gpu_nics.prefix
        return [(f"vpc{n}", f"{prefix}-net-{n}", f"{prefix}-sub-{n}", "NetDevice")
                for n in range(1, len(nets.gpu_nics.subnet_cidrs) + 1)]
    return []


def network_mapping(env: GcpEnvironment, base: Callable[[str], list[Manifest]]) -> list[Manifest]:
    """A GKENetworkParamSet and a Network per extra NIC (`base`: render's reader of manifests/)."""
    rendered = []
    for name, vpc, subnet, mode in _nics(env):
        params, network = base("network.yaml")
        params["metadata"]["name"] = network["metadata"]["name"] = name
        spec_of(params).update(vpc=vpc, vpcSubnet=subnet, deviceMode=mode)
        spec_of(network)["parametersRef"]["name"] = name
        rendered += [params, network]
    return rendered


def interfaces(env: GcpEnvironment) -> list[dict[str, str]]:
    """The pod's interfaces: eth0 on the default network, then one per extra NIC."""
    return [{"interfaceName": "eth0", "network": "default"}] + [
        {"interfaceName": f"eth{i}", "network": name} for i, (name, *_) in enumerate(_nics(env), start=1)]


def installers(env: GcpEnvironment) -> list[Manifest]:
    """The DaemonSets that ready the GPU nodes: the NRI device injector the sidecar's device annotation needs (TCPX
    and TCPXO), then the NCCL plugin installer; none for A2."""
    machine = env.machine
    rendered = [as_manifest(copy.deepcopy(obj)) for obj in catalog.upstream(machine.transport.device_injector)] \
        if machine.transport.device_injector else []
    if machine.installer is None:
        return rendered
    (daemonset,) = map(as_manifest, catalog.upstream(machine.installer))
    spec = spec_of(daemonset)["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    accelerator = next(e for e in terms[0]["matchExpressions"] if e["key"] == "cloud.google.com/gke-accelerator")
    accelerator["values"] = sorted({pool.accelerator.type for pool in env.gpu_pools})
    if env.ray.nccl_installer_image:
        installer = next(c for c in spec["initContainers"] if c["name"] == daemonset["metadata"]["name"])
        installer["image"] = env.ray.nccl_installer_image
    return rendered + [daemonset]


def add_to_worker(env: GcpEnvironment, pool: GpuPool, group: dict[str, Any],
                  base_part: Callable[[str], dict[str, Any]]) -> None:
    """The pool's network stack on its worker group (`base_part`: render's reader of manifests/)."""
    machine = catalog.GPU_MACHINES[pool.machine_type]
    template, spec = group["template"], group["template"]["spec"]
    container = spec["containers"][0]
    transport = machine.transport
    if transport.extra_networks != "none" and env.ray.multi_nic:
        template["metadata"]["annotations"].update({"networking.gke.io/default-interface": "eth0",
                                                    "networking.gke.io/interfaces": json.dumps(interfaces(env))})
    if transport.name == "rdma":
        part = base_part("worker-rdma.yaml")
        for init in part["initContainers"]:
            init["image"] = env.pulled_image
        _add(spec, container, part["setup"], part["initContainers"], part["env"], part["volumeMounts"], part["volumes"])
    elif transport.pod:
        _add_gpudirect_tcp(spec, template, container, transport, transport.pod)
    if machine.nccl_tuner_config and pool.accelerator.type in env.ray.nccl_tuner_config:
        container["env"].append({"name": "NCCL_TUNER_CONFIG_PATH",
                                 "value": env.ray.nccl_tuner_config[pool.accelerator.type]})


def _add_gpudirect_tcp(spec: dict[str, Any], template: dict[str, Any], container: dict[str, Any],
                       transport: catalog.Transport, pod_path: str) -> None:
    """The upstream test pod's (at `pod_path`) sidecar, its device annotation and volumes, and its workload
    container's settings."""
    pod = next(obj for obj in catalog.upstream(pod_path) if obj["kind"] == "Pod")
    sidecar = next(c for c in pod["spec"]["containers"] if c["name"] == transport.sidecar)
    workload = next(c for c in pod["spec"]["containers"] if c["name"] == transport.workload)
    sidecar["restartPolicy"] = "Always"
    annotation = f"devices.gke.io/container.{transport.sidecar}"
    template["metadata"]["annotations"][annotation] = pod["metadata"]["annotations"][annotation]
    dropped = {"config-volume", "shared-memory"}
    volumes = [v for v in pod["spec"]["volumes"] if v["name"] not in dropped]
    mounts = [m if m["name"] != "tcpx-socket" else {**m, "mountPath": TCPX_SOCKET}
              for m in workload["volumeMounts"] if m["name"] not in dropped]
    env = list(workload["env"]) + [{"name": name, "value": value} for name, value in transport.nccl_env]
    if transport.nccl_env_from:
        env += [{"name": name, "value": value} for name, value in nccl_settings(transport.nccl_env_from)]
    if any(m["name"] == "tcpx-socket" for m in mounts):
        env.append({"name": "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "value": TCPX_SOCKET})
    setup = [f"source {transport.nccl_env_script}"] if transport.nccl_env_script else []
    _add(spec, container, setup, [sidecar], env, mounts, volumes)


def nccl_settings(path: str) -> list[tuple[str, str]]:
    """The `-x NAME=VALUE` settings the upstream NCCL test passes to mpirun (its run-nccl.sh), quotes removed,
    less those the workload container sets itself."""
    found = re.findall(r'-x (\w+)=("?)([^"\s]*)\2', catalog.upstream_text(path))
    return [(name, value) for name, _, value in found if name not in _NOT_NCCL]


def _add(spec: dict[str, Any], container: dict[str, Any], setup: list[str], inits: list[dict[str, Any]],
         env: list[dict[str, Any]], mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> None:
    if setup:
        args = container["args"][0]
        head, tail = args.split(" ulimit ", 1)  # the transport's lines go after `ldconfig`, before `ulimit`
        container["args"] = [" ".join([head, *(f"{line};" for line in setup), f"ulimit {tail}"])]
    if inits:
        spec["initContainers"] = spec.get("initContainers", []) + inits
    container["env"] += env
    container["volumeMounts"] += mounts
    spec["volumes"] += volumes
