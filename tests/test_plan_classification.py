"""What a one-line edit of a spec does to the plan: the pure core (graph, diff, classification), no I/O.

Each case applies an edit to a seed spec, plans it against the cloud as the unedited spec left it,
and expects exactly the listed actions (everything else unchanged) and which of them are destructive.
"""

from dataclasses import replace

import pytest

from conftest import ENVIRONMENTS
from rlops.provision import render
from rlops.provision.plan import Action, Change, Live, Plan, build_plan, data_loss_refusals
from rlops.provision.resources import KINDS, build
from rlops.spec.load import load_text

C, U, R, D = Action.CREATE, Action.UPDATE, Action.REPLACE, Action.DELETE
RDMA = [f"subnetwork/rl-rdma-sub-{i}" for i in range(8)]


def environment(text: str, name: str):
    loaded = load_text(text, name, f"{name}.yaml")
    assert not loaded.problems, "\n".join(map(str, loaded.problems))
    return loaded.environment


def live_of(name: str, text: str) -> dict[str, Live]:
    """The cloud as an apply of this spec left it."""
    return {r.key: Live({f: v for f, v in r.desired.items() if f in KINDS[r.kind].fields}, True, r.depends_on)
            for r in build(name, environment(text, name))}


def plan_edit(name: str, *edits: tuple[str, str], live: dict[str, Live] | None = None) -> Plan:
    original = (ENVIRONMENTS / f"{name}.yaml").read_text()
    edited = original
    for old, new in edits:
        assert old in edited, old
        edited = edited.replace(old, new)
    return build_plan(name, build(name, environment(edited, name)), live if live is not None else live_of(name, original))


def actions(plan: Plan) -> dict[str, Action]:
    return {c.key: c.action for c in plan.changes if c.action != Action.NOOP}


CASES = [
    # (id, environment, edits, expected actions, destructive keys)
    ("gpu-max-nodes", "h200", [("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 0, max_nodes: 4}")],
     {"node_pool/gpu-pool": U}, set()),
    ("gpu-min-nodes", "h200", [("{min_nodes: 0, max_nodes: 2}", "{min_nodes: 1, max_nodes: 2}")],
     {"node_pool/gpu-pool": U}, set()),
    ("system-pool-max", "h200", [("{min_nodes: 1, max_nodes: 5}", "{min_nodes: 1, max_nodes: 6}")],
     {"node_pool/default-pool": U}, set()),
    ("firewall-source", "h200", [("firewall_source_ranges: [192.168.0.0/16]", "firewall_source_ranges: [192.168.0.0/16, 10.8.0.0/16]")],
     {"firewall/rl-gvnic-internal": U}, set()),
    ("network-mtu", "h200", [("    prefix: rl-rdma            # profile: ZONE-vpc-roce\n", "    prefix: rl-rdma\n    mtu: 8244\n")],
     {"network/rl-rdma-net": U}, set()),
    ("release-channel", "h200", [("release_channel: REGULAR", "release_channel: RAPID")], {"cluster/rl-h200": U}, set()),
    ("cluster-version", "h200", [("release_channel: REGULAR", "release_channel: REGULAR\n  version: \"1.33\"")],
     {"cluster/rl-h200": U}, set()),
    ("lustre-legacy-port-and-gke-support", "h200",
     [("lustre_legacy_port: true", "lustre_legacy_port: false"), ("gke_support: true", "gke_support: false"),
      ("prefix_length: 20", "prefix_length: 20\n    address: 10.112.0.0")],
     # The add-on flag is mutable, GKE support on the instance is not; no legacy port means an LNet firewall.
     {"cluster/rl-h200": U, "lustre_instance/rl-lustre": R, "firewall/rl-lustre-lnet": C}, {"lustre_instance/rl-lustre"}),
    ("lustre-grow", "h200", [("capacity_gib: 18000", "capacity_gib: 36000")], {"lustre_instance/rl-lustre": U}, set()),
    ("lustre-throughput-tier", "h200", [("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 1000")],
     {"lustre_instance/rl-lustre": R}, {"lustre_instance/rl-lustre"}),
    ("gvnic-subnet-cidr", "h200", [("subnet_cidr: 192.168.0.0/24", "subnet_cidr: 192.168.9.0/24")],
     {"subnetwork/rl-gvnic-sub": R, "node_pool/gpu-pool": R}, {"subnetwork/rl-gvnic-sub", "node_pool/gpu-pool"}),
    ("rdma-subnet-cidr", "h200", [("- 192.168.8.0/24", "- 192.168.18.0/24")],
     {"subnetwork/rl-rdma-sub-7": R, "node_pool/gpu-pool": R}, {"subnetwork/rl-rdma-sub-7", "node_pool/gpu-pool"}),
    ("reservation-to-spot", "h200", [("reservation: h200-reservation", "spot: true")],
     {"node_pool/gpu-pool": R}, {"node_pool/gpu-pool"}),
    ("machine-type", "h200", [("machine_type: a3-ultragpu-8g", "machine_type: a4-highgpu-8g"),
                              ("type: nvidia-h200-141gb", "type: nvidia-b200")],
     {"node_pool/gpu-pool": R}, {"node_pool/gpu-pool"}),
    ("psa-prefix", "h200", [("prefix_length: 20", "prefix_length: 22")],
     # The peering is re-made on the new range, and the Lustre instance peered into it with it.
     {"address/rl-lustre-range": R, "connection/rl-net": R, "lustre_instance/rl-lustre": R},
     {"address/rl-lustre-range", "connection/rl-net", "lustre_instance/rl-lustre"}),
    ("rename-gpu-pool", "h200", [("gpu-pool", "gpu-pool-b")],
     {"node_pool/gpu-pool": D, "node_pool/gpu-pool-b": C}, {"node_pool/gpu-pool"}),
    ("add-gpu-pool", "h200", [("\nlustre:\n", "\n  - name: gpu-pool-2\n    machine_type: a3-ultragpu-8g\n"
                                             "    accelerator: {type: nvidia-h200-141gb, count: 8}\n"
                                             "    spot: true\n    autoscaling: {min_nodes: 0, max_nodes: 1}\n\nlustre:\n"),
                             ("    runner: nemo-rl\n", "    runner: nemo-rl\n    gpu_pool: gpu-pool\n")],
     {"node_pool/gpu-pool-2": C}, set()),
    ("b200-gpu-max-nodes", "b200-spot", [("{min_nodes: 0, max_nodes: 8}", "{min_nodes: 0, max_nodes: 10}")],
     {"node_pool/a4-pool": U}, set()),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_edit_plans_exactly_its_change(case):
    _, name, edits, expected, destructive = case
    plan = plan_edit(name, *edits)
    assert not plan.errors
    assert actions(plan) == expected
    assert {c.key for c in plan.destructive} == destructive


def test_no_edit_means_no_change():
    plan = plan_edit("h200")
    assert not plan.has_changes and not plan.errors and plan.summary().startswith("0 to create, 0 to update")


def test_shrinking_lustre_is_refused_and_left_alone():
    plan = plan_edit("b200-spot", ("capacity_gib: 36000", "capacity_gib: 18000"))
    assert any("capacity_gib can only grow" in e for e in plan.errors)
    assert actions(plan) == {}


def test_replacing_lustre_needs_the_delete_policy_and_delete_data():
    plan = plan_edit("h200", ("throughput_mb_per_tib: 500", "throughput_mb_per_tib: 1000"))
    assert data_loss_refusals(plan, "retain", delete_data=True)
    assert data_loss_refusals(plan, "delete", delete_data=False)
    assert data_loss_refusals(plan, "delete", delete_data=True) == []


def test_drift_is_an_update_back_to_the_spec():
    text = (ENVIRONMENTS / "h200.yaml").read_text()
    live = live_of("h200", text)
    network = live["network/rl-gvnic-net"]
    live["network/rl-gvnic-net"] = replace(network, fields=dict(network.fields, mtu=1460))
    plan = plan_edit("h200", live=live)
    (change,) = [c for c in plan.changes if c.action != Action.NOOP]
    assert (change.key, change.action) == ("network/rl-gvnic-net", U)
    assert [(f.field, f.before, f.after) for f in change.fields] == [("mtu", 1460, 8896)]


def test_unowned_resources_are_adopted_when_identical_and_refused_when_not():
    text = (ENVIRONMENTS / "h200.yaml").read_text()
    live = live_of("h200", text)
    live["network/rl-net"] = replace(live["network/rl-net"], owned=False)
    assert actions(plan_edit("h200", live=live)) == {"network/rl-net": Action.ADOPT}
    live["network/rl-net"] = replace(live["network/rl-net"], fields=dict(live["network/rl-net"].fields, mtu=1460))
    plan = plan_edit("h200", live=live)
    assert actions(plan) == {}
    assert any("network/rl-net exists but is not managed by rlops" in e for e in plan.errors)


def test_what_rlops_owns_and_the_spec_dropped_is_deleted():
    text = (ENVIRONMENTS / "h200.yaml").read_text()
    live = live_of("h200", text)
    live["firewall/old-rule"] = Live({"network": "rl-net"}, True, ("network/rl-net",))
    live["firewall/someone-elses"] = Live({"network": "rl-net"}, False)
    plan = plan_edit("h200", live=live)
    assert actions(plan) == {"firewall/old-rule": D}
    assert not plan.destructive  # a firewall rule is recreated as it was


def test_from_nothing_everything_is_created_and_the_system_pool_comes_with_the_cluster():
    plan = plan_edit("h200", live={})
    created = actions(plan)
    assert set(created.values()) == {C} and len(created) == 18
    assert "node_pool/default-pool" not in created
    assert set(RDMA) <= set(created)


def test_markdown_puts_destructive_changes_first_and_splits_below_githubs_limit():
    plan = plan_edit("h200", ("reservation: h200-reservation", "spot: true"),
                     ("firewall_source_ranges: [192.168.0.0/16]", "firewall_source_ranges: [192.168.0.0/16, 10.8.0.0/16]"))
    (comment,) = render.markdown([plan])
    assert comment.startswith("### Environment `h200`")
    assert "**Plan: 0 to create, 1 to update, 1 to replace, 0 to delete.**" in comment
    assert comment.index("Destructive") < comment.index("<details>")
    assert "`node_pool/gpu-pool`" in comment[:comment.index("<details>")]
    # A plan far over one comment is split into several, each complete and under the limit.
    many = Plan("big", [Change(f"firewall/rule-{i:05d}", Action.DELETE, None, reason="x" * 200) for i in range(2000)])
    comments = render.markdown([plan, many])
    assert len(comments) > 1
    assert all(len(c) < render.GITHUB_COMMENT_LIMIT for c in comments)
    assert all(c.count("<details>") == c.count("</details>") and c.count("```") % 2 == 0 for c in comments)
    assert sum(c.count("- firewall/rule-") for c in comments) == 2000
