"""A short, human summary of what an environment spec describes."""

from rlops.spec.model import GcpEnvironment, LocalEnvironment


def describe(name: str, env: GcpEnvironment | LocalEnvironment) -> list[str]:
    lines = [f"environment {name} ({env.provider}); state in gs://{env.state.bucket}/{env.state.prefix}/"]
    if isinstance(env, LocalEnvironment):
        pool = env.local.gpu_pool
        lines += [
            f"  ray: a local head on 127.0.0.1 and {pool.workers} worker node(s) of pool {pool.name}, "
            f"each with {pool.cpus_per_worker} CPU and {pool.per_worker} {pool.resource} resource standing in for GPUs",
            f"  lustre: the directory {env.local.lustre_dir}",
        ]
    else:
        nets = env.networks
        # The GPU NICs' networks are the machine family's: gVNIC and RDMA, one per GPU NIC (TCPX(O)), or none (A2).
        networks = [f"{nets.cluster.name} (mtu {nets.cluster.mtu})"]
        if nets.gvnic:
            networks.append(f"{nets.gvnic.prefix}-net {nets.gvnic.subnet_cidr}")
        if nets.rdma:
            networks.append(f"{nets.rdma.prefix}-net profile {env.rdma_profile} with {len(nets.rdma.subnet_cidrs)} "
                            "subnets")
        if nets.gpu_nics:
            networks.append(f"{nets.gpu_nics.prefix}-net-1..{len(nets.gpu_nics.subnet_cidrs)}, one per GPU NIC")
        networks.append(f"PSA range {nets.private_service_access.range_name} "
                        f"/{nets.private_service_access.prefix_length}")
        lines += [
            f"  project {env.project.id} ({env.project.number}), region {env.region}, zone {env.zone}",
            "  networks: " + "; ".join(networks),
            f"  cluster {env.cluster.name} ({env.cluster.release_channel}), system pool "
            f"{env.cluster.system_pool.machine_type}",
        ]
        for pool in env.gpu_pools:
            capacity = f"reservation {pool.reservation}" if pool.reservation else "spot"
            lines.append(f"  gpu pool {pool.name}: {pool.machine_type} x {pool.accelerator.count} "
                         f"{pool.accelerator.type}, "
                         f"{capacity}, {pool.autoscaling.min_nodes}..{pool.autoscaling.max_nodes} nodes, "
                         f"{pool.ray_worker_replicas} Ray workers")
        lustre = env.lustre
        lines += [
            f"  lustre {lustre.name}: {lustre.capacity_gib} GiB at {lustre.throughput_mb_per_tib} MB/s/TiB, "
            f"filesystem {lustre.filesystem}, deletion policy {lustre.deletion_policy}",
            f"  ray cluster {env.ray.cluster_name}: {env.ray.image} (Ray {env.ray.ray_version}), "
            f"mounted at {env.ray.lustre_mount}",
        ]
    for recipe_name, recipe in env.recipes.items():
        allowed = ", ".join(recipe.allowed_overrides) or "nothing"
        lines.append(f"  recipe {recipe_name}: {recipe.runner} {recipe.model}; a train message may set {allowed}; "
                     f"checkpoints in {recipe.checkpoint_root}/RUN")
    lines.append(f"  idle: after {env.idle.timeout} without jobs, scale down {', '.join(env.idle.scale_down)}")
    return lines


def summary(name: str, env: GcpEnvironment | LocalEnvironment) -> dict:
    """What `rlops environments` lists of one: where it runs, and each GPU pool's machine type and size."""
    if isinstance(env, LocalEnvironment):
        pool = env.local.gpu_pool
        return {"name": name, "provider": "local", "where": "local",
                "gpu_pools": [{"name": pool.name, "machine_type": None, "nodes": pool.workers, "gpus": 0,
                               "capacity": f"Ray worker node(s) with the {pool.resource} resource",
                               "counts_as": pool.counts_as.machine_type}]}
    return {"name": name, "provider": "gcp", "where": f"{env.project.id}/{env.region}",
            "gpu_pools": [{"name": pool.name, "machine_type": pool.machine_type, "nodes": pool.autoscaling.max_nodes,
                           "gpus": pool.autoscaling.max_nodes * pool.accelerator.count,
                           "capacity": f"reservation {pool.reservation}" if pool.reservation else "spot"}
                          for pool in env.gpu_pools]}


def pool_line(pool: dict) -> str:
    """One GPU pool of `summary`, as `rlops environments` prints it."""
    if pool["machine_type"] is None:
        return f"{pool['name']}: {pool['nodes']} {pool['capacity']}, counted as {pool['counts_as']}"
    return f"{pool['name']}: {pool['machine_type']} x {pool['nodes']} ({pool['gpus']} GPUs at most), {pool['capacity']}"
