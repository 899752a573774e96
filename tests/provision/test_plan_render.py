"""Plans as a pull-request comment (markdown), a terminal (text) and JSON: pure rendering, no I/O."""

import json
import re

import pytest

from plans_support import plan_edit
from rlops.provision import output
from rlops.provision.plan import Action, Change, Plan

LIMIT = output.GITHUB_COMMENT_LIMIT
TO_SPOT = ("reservation: h200-reservation", "spot: true")
NARROWER_FIREWALL = ("firewall_source_ranges: [192.168.0.0/16]", "firewall_source_ranges: [192.168.0.0/20]")


def destructive_plan() -> Plan:
    return plan_edit("h200", TO_SPOT, NARROWER_FIREWALL)


def fake_plan(name: str, n: int, destructive: bool = False, reason: str = "x" * 200) -> Plan:
    return Plan(name, [Change(f"firewall/rule-{i:05d}", Action.DELETE, None, destructive=destructive, reason=reason)
                       for i in range(n)])


def assert_well_formed(comment: str) -> None:
    assert len(comment) < LIMIT
    assert comment.count("<details>") == comment.count("</details>")
    assert comment.count("```") % 2 == 0


# -- markdown --------------------------------------------------------------------------------

def test_markdown_heads_each_environment_and_lists_destructive_changes_before_the_details():
    (comment,) = output.markdown([destructive_plan(), plan_edit("b200-spot")])
    assert_well_formed(comment)
    h200, b200 = comment.split("### Environment `b200-spot`")
    assert h200.startswith("### Environment `h200`\n\n**Plan: 0 to create, 1 to update, 1 to replace, 0 to delete.**\n")
    caution, details = h200.split("<details><summary>Show changes</summary>")
    assert ("> [!CAUTION]\n> **Destructive changes**\n"
            "> - **replace** `node_pool/gpu-pool`: spot cannot change in place") in caution
    assert "firewall" not in caution  # an update is not destructive
    assert "```diff\n" in details and details.rstrip().endswith("</details>")
    assert "~ firewall/rl-gvnic-internal\n    source_ranges: [\"192.168.0.0/16\"] -> [\"192.168.0.0/20\"]\n" in details
    assert "-/+ node_pool/gpu-pool  (spot cannot change in place)\n    spot: false -> true  (immutable)\n" in details
    assert "network/rl-net" not in details  # no-ops are not shown
    assert b200.strip() == "**Plan: 0 to create, 0 to update, 0 to replace, 0 to delete.**\n\nNo changes."


def test_markdown_warns_when_a_plan_cannot_be_applied():
    plan = plan_edit("b200-spot", ("capacity_gib: 36000", "capacity_gib: 18000"))
    (comment,) = output.markdown([plan])
    assert ("> [!WARNING]\n> **This plan cannot be applied:**\n"
            "> - lustre_instance/ray-a4-gpu-spot-lustre: capacity_gib can only grow") in comment
    assert "No changes." not in comment and "<details>" not in comment


def test_markdown_shows_what_a_create_sets_but_not_the_system_pool_blob():
    (comment,) = output.markdown([plan_edit("h200", live={})])
    assert "**Plan: 20 to create, 0 to update, 0 to replace, 0 to delete.**" in comment
    assert "+ cluster/rl-h200\n    location: \"us-central1\"\n" in comment
    assert "system_pool" not in comment and "node_pool/default-pool" not in comment


def test_a_huge_plan_is_split_into_comments_each_under_githubs_limit():
    plans = [destructive_plan(), fake_plan("big", 3000), plan_edit("b200-spot")]
    comments = output.markdown(plans)
    assert len(comments) > 1
    for i, comment in enumerate(comments, 1):
        assert comment.startswith(f"_Plan part {i} of {len(comments)}_\n\n")
        assert_well_formed(comment)
    joined = "".join(comments)
    # Every change once, in order, and the environments in order.
    rules = re.findall(r"^- firewall/rule-(\d{5})", joined, flags=re.M)
    assert rules == [f"{i:05d}" for i in range(3000)]
    headings = re.findall(r"^### Environment `([^`]+)`", joined, flags=re.M)
    assert headings == ["h200", "big", "b200-spot"]
    assert joined.index("> [!CAUTION]") < joined.index("<details>")


def test_the_split_follows_a_smaller_limit_too():
    comments = output.markdown([fake_plan("big", 200, reason="y" * 40)], limit=2_000)
    assert len(comments) > 2 and all(len(c) < 2_000 for c in comments)


def test_an_overlong_line_is_cut_rather_than_breaking_the_limit():
    (comment,) = output.markdown([fake_plan("long", 1, reason="z" * 100_000)])
    assert_well_formed(comment)
    assert " …\n" in comment


@pytest.mark.parametrize("plan", [
    fake_plan("destructive", 400, destructive=True),
    Plan("errors", [], errors=[f"node_pool/pool-{i}: " + "e" * 150 for i in range(1000)]),
], ids=["destructive", "errors"])
def test_a_huge_header_is_split_too(plan):
    for comment in output.markdown([plan]):
        assert_well_formed(comment)


# -- text and JSON ---------------------------------------------------------------------------

def test_text_lists_destructive_changes_first_and_says_when_nothing_changes():
    out = output.text(destructive_plan())
    assert out.startswith("Plan for environment h200: 0 to create, 1 to update, 1 to replace, 0 to delete.\n")
    assert out.index("DESTRUCTIVE changes:\n  -/+ node_pool/gpu-pool (replace: spot cannot change in place)") \
        < out.index("~ firewall/rl-gvnic-internal")
    assert output.text(plan_edit("h200")) == (
        "Plan for environment h200: 0 to create, 0 to update, 0 to replace, 0 to delete.\n"
        "No changes: the cloud matches the spec.\n")


def test_json_carries_every_change_with_its_class_and_fields():
    (doc,) = json.loads(output.as_json([destructive_plan()]))
    assert doc["environment"] == "h200" and doc["errors"] == []
    assert doc["summary"] == {"create": 0, "update": 1, "replace": 1, "delete": 0, "adopt": 0}
    by_address = {c["address"]: c for c in doc["changes"]}
    assert by_address["node_pool/gpu-pool"]["destructive"] is True
    assert by_address["node_pool/gpu-pool"]["fields"] == [
        {"field": "spot", "before": False, "after": True, "mutability": "immutable"}]
    assert by_address["firewall/rl-gvnic-internal"]["action"] == "update"
    assert by_address["network/rl-net"]["action"] == "no-op"
    (created,) = json.loads(output.as_json([plan_edit("h200", live={})]))
    cluster = {c["address"]: c for c in created["changes"]}["cluster/rl-h200"]
    assert cluster["action"] == "create" and "system_pool" not in cluster["create"]
