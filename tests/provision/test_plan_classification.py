"""What one edit of a spec does to the plan: the pure core (graph, diff, classification), no I/O.

Each case edits a seed spec's text, plans the edited spec against the cloud as an apply of the
unedited spec left it, and expects exactly the listed actions (everything else a no-op) and
exactly the listed destructive changes.
"""

from dataclasses import replace

import pytest
import yaml

from plans_support import edit, environment, live_of, plan_edit, seed
from rlops.provision.plan import Action, Plan, build_plan, data_loss_refusals
from rlops.provision.resources import build
from rlops.resource_shapes import Live
from rlops.spec.load import load_text
from rlops.spec.model import GcpEnvironment

C, U, R, D, A = Action.CREATE, Action.UPDATE, Action.REPLACE, Action.DELETE, Action.ADOPT
H200_RDMA = [f"subnetwork/rl-rdma-sub-{i}" for i in range(8)]
H200_POOLS = {"node_pool/default-pool": R, "node_pool/gpu-pool": R}

SECOND_POOL = ("\nlustre:\n", "\n  - name: gpu-pool-2\n    machine_type: a3-ultragpu-8g\n"
                              "    accelerator: {type: nvidia-h200-141gb, count: 8}\n"
                              "    spot: true\n    autoscaling: {min_nodes: 0, max_nodes: 1}\n\nlustre:\n")
RECIPE_POOL = ("    runner: nemo-rl\n", "    runner: nemo-rl\n    gpu_pool: gpu-pool\n")


# -- the edit-and-plan dance -----------------------------------------------------------------
# (seed, edit and plan_edit are tests/plans_support.py's, shared)

def plan_unchecked(name: str, change) -> Plan:
    """For edits the spec's cross-field rules refuse: `change(data)` edits the parsed YAML, which is
    then only type-checked, so the plan's own rules can be seen on their own."""
    data = yaml.safe_load(seed(name))
    change(data)
    return build_plan(name, build(name, GcpEnvironment.model_validate(data)),
                      live_of(name, environment(seed(name), name)))


def actions(plan: Plan) -> dict[str, Action]:
    return {c.key: c.action for c in plan.changes if c.action != Action.NOOP}


def change_of(plan: Plan, key: str):
    (change,) = [c for c in plan.changes if c.key == key]
    return change


def fields_of(plan: Plan, key: str) -> list[tuple]:
    return [(f.field, f.before, f.after) for f in change_of(plan, key).fields]


# -- one edit, one class of change -----------------------------------------------------------

KEEP_NODE_POOLS = ("scale_down: [ray-workers, node-pools]", "scale_down: [ray-workers]")

CASES = [
    # (id, environment, edits, expected actions, destructive keys)
    ("gpu-max-nodes", "h200", [("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 0, max_nodes: 4}")],
     {"node_pool/gpu-pool": U}, set()),
    # A GPU pool that keeps a node cannot also be resized to 0 by the reaper (validate refuses it).
    ("gpu-min-nodes", "h200", [("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 1, max_nodes: 2}"), KEEP_NODE_POOLS],
     {"node_pool/gpu-pool": U}, set()),
    ("b200-gpu-max-nodes", "b200-spot", [("{min_nodes: 0, max_nodes: 8}", "{min_nodes: 0, max_nodes: 10}")],
     {"node_pool/a4-pool": U}, set()),
    ("system-pool-max", "h200", [("{min_nodes: 1, max_nodes: 5}", "{min_nodes: 1, max_nodes: 6}")],
     {"node_pool/default-pool": U}, set()),
    ("system-pool-autoscaling-off", "h200", [("    autoscaling: {min_nodes: 1, max_nodes: 5}\n", "")],
     {"node_pool/default-pool": U}, set()),
    ("system-pool-autoscaling-on", "b200-spot",
     [("    initial_nodes: 1\n", "    initial_nodes: 1\n    autoscaling: {min_nodes: 1, max_nodes: 3}\n")],
     {"node_pool/default-pool": U}, set()),
    ("system-pool-machine-type", "h200", [("machine_type: n2-highmem-80", "machine_type: n2-highmem-96")],
     {"node_pool/default-pool": R}, {"node_pool/default-pool"}),
    ("gpu-machine-type", "h200", [("machine_type: a3-ultragpu-8g", "machine_type: a4-highgpu-8g"),
                                  ("type: nvidia-h200-141gb", "type: nvidia-b200")],
     {"node_pool/gpu-pool": R}, {"node_pool/gpu-pool"}),
    ("gpu-driver-version", "h200", [("driver_version: default", "driver_version: latest")],
     {"node_pool/gpu-pool": R}, {"node_pool/gpu-pool"}),
    ("reservation-to-spot", "h200", [("reservation: h200-reservation", "spot: true")],
     {"node_pool/gpu-pool": R}, {"node_pool/gpu-pool"}),
    ("spot-to-reservation", "b200-spot", [("spot: true", "reservation: b200-reservation")],
     {"node_pool/a4-pool": R}, {"node_pool/a4-pool"}),
    # A node pool's placementPolicy is fixed at creation: compact placement comes with a new pool.
    ("gpu-pool-compact-placement", "b200-spot", [("    spot: true\n", "    spot: true\n    placement: compact\n")],
     {"node_pool/a4-pool": R}, {"node_pool/a4-pool"}),
    ("firewall-source-ranges", "h200",
     [("firewall_source_ranges: [192.168.0.0/16]", "firewall_source_ranges: [192.168.0.0/16, 10.8.0.0/16]")],
     {"firewall/rl-gvnic-internal": U}, set()),
    ("cluster-network-mtu", "h200", [("    name: rl-net\n", "    name: rl-net\n    mtu: 1460\n")],
     {"network/rl-net": U}, set()),
    ("rdma-network-mtu", "h200", [("    prefix: rl-rdma            # profile: ZONE-vpc-roce\n",
                                   "    prefix: rl-rdma\n    mtu: 8244\n")],
     {"network/rl-rdma-net": U}, set()),
    ("release-channel", "h200", [("release_channel: REGULAR", "release_channel: RAPID")], {"cluster/rl-h200": U},
     set()),
    ("cluster-version", "h200", [("release_channel: REGULAR", "release_channel: REGULAR\n  version: \"1.33\"")],
     {"cluster/rl-h200": U}, set()),
    ("dns-endpoint", "h200", [("release_channel: REGULAR", "release_channel: REGULAR\n  dns_endpoint: false")],
     {"cluster/rl-h200": U}, set()),
    # IP aliases cannot be switched on a running cluster: it goes, and its node pools with it.
    ("ip-alias", "h200", [("release_channel: REGULAR", "release_channel: REGULAR\n  ip_alias: false")],
     {"cluster/rl-h200": R, **H200_POOLS}, {"cluster/rl-h200", *H200_POOLS}),
    ("lustre-grow", "h200", [("capacity_gib: 18000", "capacity_gib: 36000")], {"lustre_instance/rl-lustre": U}, set()),
    ("lustre-throughput-tier", "h200", [("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 1000")],
     {"lustre_instance/rl-lustre": R}, {"lustre_instance/rl-lustre"}),
    # Additional networks are immutable on a node pool: a subnet replaced replaces the pool with it.
    ("gvnic-subnet-cidr", "h200", [("subnet_cidr: 192.168.0.0/24", "subnet_cidr: 192.168.9.0/24")],
     {"subnetwork/rl-gvnic-sub": R, "node_pool/gpu-pool": R}, {"subnetwork/rl-gvnic-sub", "node_pool/gpu-pool"}),
    ("rdma-subnet-cidr", "h200", [("- 192.168.8.0/24", "- 192.168.18.0/24")],
     {"subnetwork/rl-rdma-sub-7": R, "node_pool/gpu-pool": R}, {"subnetwork/rl-rdma-sub-7", "node_pool/gpu-pool"}),
    ("gvnic-prefix", "h200", [("prefix: rl-gvnic", "prefix: rl-gvnic2")],
     {"network/rl-gvnic2-net": C, "subnetwork/rl-gvnic2-sub": C, "firewall/rl-gvnic2-internal": C,
      "node_pool/gpu-pool": R, "network/rl-gvnic-net": D, "subnetwork/rl-gvnic-sub": D,
      "firewall/rl-gvnic-internal": D},
     {"node_pool/gpu-pool", "network/rl-gvnic-net", "subnetwork/rl-gvnic-sub"}),
    # The peering is re-made on the new range, and the Lustre instance peered into it with it.
    ("psa-prefix", "h200", [("prefix_length: 20", "prefix_length: 22")],
     {"address/rl-lustre-range": R, "connection/rl-net": R, "lustre_instance/rl-lustre": R,
      "firewall/rl-lustre-lnet": U},
     {"address/rl-lustre-range", "connection/rl-net", "lustre_instance/rl-lustre"}),
    ("psa-prefix-with-lnet-firewall", "b200-spot", [("prefix_length: 22 ", "prefix_length: 20 ")],
     {"address/ray-a4-gpu-spot-psa": R, "connection/ray-a4-gpu-spot-net-0": R,
      "lustre_instance/ray-a4-gpu-spot-lustre": R, "firewall/ray-a4-gpu-spot-lustre-lnet": U},
     {"address/ray-a4-gpu-spot-psa", "connection/ray-a4-gpu-spot-net-0", "lustre_instance/ray-a4-gpu-spot-lustre"}),
    # Everything is built on the cluster network: an auto-mode switch takes the environment down to Lustre.
    ("auto-subnets", "h200", [("auto_subnets: true", "auto_subnets: false")],
     {"network/rl-net": R, "address/rl-lustre-range": R, "connection/rl-net": R, "cluster/rl-h200": R, **H200_POOLS,
      "lustre_instance/rl-lustre": R, "firewall/rl-lustre-lnet": R},
     {"network/rl-net", "address/rl-lustre-range", "connection/rl-net", "cluster/rl-h200", *H200_POOLS,
      "lustre_instance/rl-lustre"}),
    ("rename-cluster", "h200", [("name: rl-h200\n", "name: rl-h200b\n")],
     {"cluster/rl-h200b": C, "cluster/rl-h200": D, **H200_POOLS}, {"cluster/rl-h200", *H200_POOLS}),
    ("rename-gpu-pool", "h200", [("name: gpu-pool", "name: gpu-pool-b")],
     {"node_pool/gpu-pool": D, "node_pool/gpu-pool-b": C}, {"node_pool/gpu-pool"}),
    ("rename-lustre", "h200", [("lustre:\n  name: rl-lustre\n", "lustre:\n  name: rl-lustre-b\n")],
     {"lustre_instance/rl-lustre": D, "lustre_instance/rl-lustre-b": C, "firewall/rl-lustre-lnet": D,
      "firewall/rl-lustre-b-lnet": C}, {"lustre_instance/rl-lustre"}),
    ("add-gpu-pool", "h200", [SECOND_POOL, RECIPE_POOL], {"node_pool/gpu-pool-2": C}, set()),
    # Edits outside the cloud resources: nothing in the cloud changes.
    ("deletion-policy", "h200", [("deletion_policy: retain", "deletion_policy: delete")], {}, set()),
    ("ray-image", "b200-spot", [("head: {cpu: 8, memory: 64Gi}", "head: {cpu: 16, memory: 64Gi}")], {}, set()),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_edit_plans_exactly_its_change(case):
    _, name, edits, expected, destructive = case
    plan = plan_edit(name, *edits)
    assert plan.errors == []
    assert actions(plan) == expected
    assert {c.key for c in plan.destructive} == destructive
    assert plan.has_changes == bool(expected)


def test_an_in_place_change_names_exactly_its_fields():
    plan = plan_edit("h200", ("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 1, max_nodes: 4}"), KEEP_NODE_POOLS)
    assert fields_of(plan, "node_pool/gpu-pool") == [("min_nodes", 0, 1), ("max_nodes", 2, 4)]
    plan = plan_edit("h200", ("firewall_source_ranges: [192.168.0.0/16]", "firewall_source_ranges: [192.168.0.0/20]"))
    assert fields_of(plan, "firewall/rl-gvnic-internal") == [("source_ranges", ["192.168.0.0/16"], ["192.168.0.0/20"])]
    plan = plan_edit("h200", ("capacity_gib: 18000", "capacity_gib: 36000"))
    assert fields_of(plan, "lustre_instance/rl-lustre") == [("capacity_gib", 18000, 36000)]


def test_a_replacement_says_which_field_forces_it_and_a_cascade_says_what_it_goes_with():
    plan = plan_edit("h200", ("subnet_cidr: 192.168.0.0/24", "subnet_cidr: 192.168.9.0/24"))
    subnet = change_of(plan, "subnetwork/rl-gvnic-sub")
    assert subnet.reason == "ip_cidr_range cannot change in place"
    assert [(f.field, f.mutability.value) for f in subnet.fields] == [("ip_cidr_range", "immutable")]
    pool = change_of(plan, "node_pool/gpu-pool")
    assert pool.reason == "replaced with subnetwork/rl-gvnic-sub" and pool.fields == []


def test_removing_a_gpu_pool_deletes_it():
    base = edit(seed("h200"), SECOND_POOL, RECIPE_POOL)
    plan = plan_edit("h200", (SECOND_POOL[1], SECOND_POOL[0]), base=base)
    assert plan.errors == []
    assert actions(plan) == {"node_pool/gpu-pool-2": D}
    (deleted,) = plan.destructive
    assert (deleted.key, deleted.reason, deleted.resource) == ("node_pool/gpu-pool-2", "no longer in the spec", None)
    assert deleted.depends_on == ("cluster/rl-h200", "subnetwork/rl-gvnic-sub", *H200_RDMA)


def test_renaming_the_cluster_creates_the_new_one_and_deletes_the_old_one_only_if_rlops_owns_it():
    renamed = ("name: rl-h200\n", "name: rl-h200b\n")
    plan = plan_edit("h200", renamed)
    assert change_of(plan, "cluster/rl-h200").reason == "no longer in the spec"
    live = live_of("h200", environment(seed("h200"), "h200"))
    live["cluster/rl-h200"] = replace(live["cluster/rl-h200"], owned=False)
    plan = plan_edit("h200", renamed, live=live)
    assert actions(plan) == {"cluster/rl-h200b": C, **H200_POOLS}
    del live["cluster/rl-h200"]
    assert actions(plan_edit("h200", renamed, live=live)) == {"cluster/rl-h200b": C, **H200_POOLS}


# -- edits the spec's rules refuse, planned anyway -------------------------------------------
# The rules insist on Dataplane V2 with multi-networking, the RayOperator add-on and one RDMA subnet
# per GPU of an 8-GPU machine; the plan must still classify such a change correctly should a spec
# ever reach it (a rule relaxed, another machine type).

def _refused_by_the_rules(name: str, *edits: tuple[str, str]) -> None:
    assert load_text(edit(seed(name), *edits), name, f"{name}.yaml").problems


def test_dataplane_and_multi_networking_replace_the_cluster_and_its_pools():
    _refused_by_the_rules("h200", ("release_channel: REGULAR", "release_channel: REGULAR\n  dataplane_v2: false"))
    plan = plan_unchecked("h200", lambda d: d["cluster"].update(dataplane_v2=False, multi_networking=False))
    assert actions(plan) == {"cluster/rl-h200": R, **H200_POOLS}
    assert {c.key for c in plan.destructive} == {"cluster/rl-h200", *H200_POOLS}
    assert fields_of(plan, "cluster/rl-h200") == [("datapath_provider", "ADVANCED_DATAPATH", "LEGACY_DATAPATH"),
                                                  ("enable_multi_networking", True, False)]


def test_the_ray_operator_add_on_is_an_update():
    _refused_by_the_rules("h200", ("ray_operator: true", "ray_operator: false"))
    plan = plan_unchecked("h200", lambda d: d["cluster"]["addons"].update(ray_operator=False))
    assert actions(plan) == {"cluster/rl-h200": U} and not plan.destructive
    assert fields_of(plan, "cluster/rl-h200") == [("ray_operator", True, False)]


@pytest.mark.parametrize("subnets, expected", [
    (lambda cidrs: cidrs + ["192.168.9.0/24"], {"subnetwork/rl-rdma-sub-8": C}),
    (lambda cidrs: cidrs[:-1], {"subnetwork/rl-rdma-sub-7": D}),
], ids=["add", "remove"])
def test_an_rdma_subnet_added_or_removed_replaces_the_gpu_pool(subnets, expected):
    _refused_by_the_rules("h200", ("      - 192.168.8.0/24\n", ""))

    def change(data):
        data["networks"]["rdma"]["subnet_cidrs"] = subnets(data["networks"]["rdma"]["subnet_cidrs"])
        data["gpu_pools"][0]["accelerator"]["count"] = len(data["networks"]["rdma"]["subnet_cidrs"])

    plan = plan_unchecked("h200", change)
    assert plan.errors == []
    assert actions(plan) == {**expected, "node_pool/gpu-pool": R}
    assert {c.key for c in plan.destructive} == {k for k, a in expected.items() if a == D} | {"node_pool/gpu-pool"}
    assert {f.field for f in change_of(plan, "node_pool/gpu-pool").fields} == {"accelerator_count",
                                                                                "additional_networks"}


# -- the plan's refusals ---------------------------------------------------------------------

def test_no_edit_means_no_change():
    plan = plan_edit("h200")
    assert not plan.has_changes and plan.errors == [] and not plan.destructive
    assert plan.summary() == "0 to create, 0 to update, 0 to replace, 0 to delete"
    assert not plan_edit("b200-spot").has_changes


def test_shrinking_lustre_is_refused_and_left_alone():
    plan = plan_edit("b200-spot", ("capacity_gib: 36000", "capacity_gib: 18000"))
    (error,) = plan.errors
    assert "lustre_instance/ray-a4-gpu-spot-lustre: capacity_gib can only grow (36000 -> 18000 refused)" in error
    assert actions(plan) == {} and not plan.has_changes


@pytest.mark.parametrize("edits", [
    [("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 1000")],
    [("lustre:\n  name: rl-lustre\n", "lustre:\n  name: rl-lustre-b\n")],
], ids=["replaced", "deleted"])
def test_losing_lustre_needs_the_delete_policy_and_delete_data(edits):
    plan = plan_edit("h200", *edits)
    (refusal,) = data_loss_refusals(plan, "retain", delete_data=False)
    assert refusal.startswith("lustre_instance/rl-lustre would be ")
    assert data_loss_refusals(plan, "retain", delete_data=True)
    assert data_loss_refusals(plan, "delete", delete_data=False)
    assert data_loss_refusals(plan, "delete", delete_data=True) == []


def test_changes_that_keep_lustre_need_no_permission():
    plan = plan_edit("h200", ("capacity_gib: 18000", "capacity_gib: 36000"))
    assert data_loss_refusals(plan, "retain", delete_data=False) == []


# -- Lustre's GKE support: deprecated, kept for an instance that has it -----------------------

GKE_SUPPORT = [("lustre_legacy_port: false", "lustre_legacy_port: true"), ("gke_support: false", "gke_support: true")]


def test_an_instance_made_with_gke_support_keeps_its_legacy_port_and_6988_is_opened_for_it():
    base = edit(seed("h200"), *GKE_SUPPORT)
    assert not plan_edit("h200", base=base).has_changes
    firewall = change_of(plan_edit("h200", base=base, live={}), "firewall/rl-lustre-lnet").resource
    assert firewall.desired["allowed"] == [["tcp", "988", "6988"]]
    # Turned off, the instance is made again (GKE support cannot change on it) and the legacy port closed.
    plan = plan_edit("h200", *[(new, old) for old, new in GKE_SUPPORT], base=base)
    assert plan.errors == []
    assert actions(plan) == {"cluster/rl-h200": U, "lustre_instance/rl-lustre": R, "firewall/rl-lustre-lnet": U}
    assert fields_of(plan, "firewall/rl-lustre-lnet") == [("allowed", [["tcp", "988", "6988"]], [["tcp", "988"]])]


def test_gke_support_asked_of_an_instance_rlops_would_make_is_refused():
    """rlops sends no deprecated gkeSupportEnabled: the instance would be made without it and replaced next time."""
    for live in (None, {}):
        plan = plan_edit("h200", *GKE_SUPPORT, live=live)
        (error,) = plan.errors
        assert error.startswith("lustre_instance/rl-lustre: lustre.gke_support: true describes an existing instance")


# -- drift, ownership, leftovers -------------------------------------------------------------

def drifted(name: str, key: str, **fields) -> dict[str, Live]:
    live = live_of(name, environment(seed(name), name))
    live[key] = replace(live[key], fields=dict(live[key].fields, **fields))
    return live


@pytest.mark.parametrize("key, drift, action, expected_fields", [
    ("network/rl-gvnic-net", {"mtu": 1460}, U, [("mtu", 1460, 8896)]),
    ("node_pool/gpu-pool", {"max_nodes": 5}, U, [("max_nodes", 5, 2)]),
    ("cluster/rl-h200", {"ray_operator": False}, U, [("ray_operator", False, True)]),
    ("firewall/rl-gvnic-internal", {"source_ranges": ["0.0.0.0/0"]}, U,
     [("source_ranges", ["0.0.0.0/0"], ["192.168.0.0/16"])]),
    ("lustre_instance/rl-lustre", {"capacity_gib": 9000}, U, [("capacity_gib", 9000, 18000)]),
    # A system pool an older rlops made in the region's three zones: moved to the environment's zone in place.
    ("node_pool/default-pool", {"node_locations": ["us-central1-a", "us-central1-b", "us-central1-c"]}, U,
     [("node_locations", ["us-central1-a", "us-central1-b", "us-central1-c"], ["us-central1-b"])]),
])
def test_drift_in_the_console_is_planned_back_to_the_spec(key, drift, action, expected_fields):
    plan = plan_edit("h200", live=drifted("h200", key, **drift))
    assert plan.errors == []
    assert actions(plan) == {key: action} and not plan.destructive
    assert fields_of(plan, key) == expected_fields


def test_drift_of_an_immutable_field_replaces():
    plan = plan_edit("h200", live=drifted("h200", "subnetwork/rl-rdma-sub-3", ip_cidr_range="10.9.0.0/24"))
    assert actions(plan) == {"subnetwork/rl-rdma-sub-3": R, "node_pool/gpu-pool": R}


def test_lustre_grown_in_the_console_is_not_shrunk_back():
    plan = plan_edit("h200", live=drifted("h200", "lustre_instance/rl-lustre", capacity_gib=36000))
    assert actions(plan) == {} and len(plan.errors) == 1 and "capacity_gib can only grow" in plan.errors[0]


def test_unowned_resources_are_adopted_when_identical_and_refused_when_not():
    live = live_of("h200", environment(seed("h200"), "h200"))
    live["network/rl-net"] = replace(live["network/rl-net"], owned=False)
    plan = plan_edit("h200", live=live)
    assert actions(plan) == {"network/rl-net": A} and plan.errors == [] and not plan.destructive
    assert plan.summary().endswith(", 1 to adopt")

    live["network/rl-net"] = replace(live["network/rl-net"], fields=dict(live["network/rl-net"].fields, mtu=1460))
    plan = plan_edit("h200", live=live)
    assert actions(plan) == {}
    (error,) = plan.errors
    assert error.startswith("network/rl-net exists but is not managed by rlops, and differs from the spec: mtu is 1460")
    assert change_of(plan, "network/rl-net").reason == "refused: not managed by rlops"


def test_an_unowned_resource_that_differs_is_not_replaced_by_a_cascade_either():
    live = live_of("h200", environment(seed("h200"), "h200"))
    pool = live["node_pool/gpu-pool"]
    live["node_pool/gpu-pool"] = replace(pool, owned=False, fields=dict(pool.fields, max_nodes=9))
    plan = plan_edit("h200", ("subnet_cidr: 192.168.0.0/24", "subnet_cidr: 192.168.9.0/24"), live=live)
    assert actions(plan) == {"subnetwork/rl-gvnic-sub": R}
    assert len(plan.errors) == 1 and plan.errors[0].startswith("node_pool/gpu-pool exists but is not managed by rlops")


def test_what_rlops_owns_and_the_spec_dropped_is_deleted_and_what_it_does_not_own_is_left():
    live = live_of("h200", environment(seed("h200"), "h200"))
    live["firewall/old-rule"] = Live({"network": "rl-net"}, True, ("network/rl-net",))
    live["subnetwork/old-sub"] = Live({"network": "rl-net"}, True, ("network/rl-net",))
    live["firewall/someone-elses"] = Live({"network": "rl-net"}, False)
    plan = plan_edit("h200", live=live)
    assert actions(plan) == {"firewall/old-rule": D, "subnetwork/old-sub": D}
    assert {c.key for c in plan.destructive} == {"subnetwork/old-sub"}  # a firewall rule is recreated as it was
    assert change_of(plan, "firewall/old-rule").depends_on == ("network/rl-net",)


def test_from_nothing_everything_is_created_and_the_system_pool_comes_with_the_cluster():
    plan = plan_edit("h200", live={})
    created = actions(plan)
    assert set(created.values()) == {C} and len(created) == 20 and not plan.destructive
    assert set(H200_RDMA) <= set(created) and "node_pool/gpu-pool" in created
    assert "remote_repository/rlops-nvcr-io" in created
    assert change_of(plan, "node_pool/default-pool").reason == "created by the cluster/rl-h200 create"


# -- known bugs ------------------------------------------------------------------------------

def test_a_resource_to_adopt_on_a_replaced_network_is_not_left_standing():
    live = live_of("h200", environment(seed("h200"), "h200"))
    live["address/rl-lustre-range"] = replace(live["address/rl-lustre-range"], owned=False)
    plan = plan_edit("h200", ("auto_subnets: true", "auto_subnets: false"), live=live)
    assert actions(plan)["network/rl-net"] == R
    # Either it goes with the network (and what is built on it too), or the plan refuses.
    refused = any("address/rl-lustre-range" in e for e in plan.errors)
    assert refused or {k: actions(plan).get(k) for k in ("address/rl-lustre-range", "connection/rl-net",
                                                         "lustre_instance/rl-lustre")} == dict.fromkeys(
        ("address/rl-lustre-range", "connection/rl-net", "lustre_instance/rl-lustre"), R)


def test_renaming_the_cluster_deletes_its_pools_before_it_or_with_it():
    from rlops.provision.engine import steps_for  # the apply's step order; imported here, it is slow to import

    original = live_of("h200", environment(seed("h200"), "h200"))
    plan = plan_edit("h200", ("name: rl-h200\n", "name: rl-h200b\n"))
    steps = {s.id: s for s in steps_for(plan)}
    in_old_cluster = [key for key, state in original.items() if "cluster/rl-h200" in state.depends_on]
    assert in_old_cluster == ["node_pool/default-pool", "node_pool/gpu-pool"]
    for key in in_old_cluster:
        if ("delete", key) in steps:
            assert ("delete", key) in steps[("delete", "cluster/rl-h200")].needs, key
