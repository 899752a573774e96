"""What a whole environment costs, and what a plan adds or removes an hour: the list prices of the system pool's CPU
machines, Managed Lustre by tier, GKE's fee and the functions (an estimate) beside the GPU catalog's; `rlops cost`
over a window with them, the window said sensibly; `rlops plan` with a line per priced resource and a total."""

import json
import uuid

import pytest

from conftest import ENVIRONMENTS
from plans_support import live_of, plan_edit
from rlops import cli, costs
from rlops.endpoints import Endpoints
from rlops.provision import output, pricing
from rlops.provision.plan import build_plan
from rlops.resource_shapes import Live
from rlops.runs import environment_cost
from rlops.sites import Site
from rlops.spec.load import load_or_raise
from rlops.spec.model import GcpEnvironment
from rlops.state.bucket import client
from rlops.state.pool import PoolStatus

T0 = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
H200_GPU = 84.806908  # a3-ultragpu-8g on demand in us-central1 (catalog.yaml)
N2_HIGHMEM_80 = 5.24056  # [CY]'s us-central1 row, platform_prices.yaml's N2 rates reproduce it


def gcp_specs() -> dict[str, GcpEnvironment]:
    found = {path.stem: load_or_raise(path) for path in sorted(ENVIRONMENTS.glob("*.yaml"))}
    return {name: env for name, env in found.items() if isinstance(env, GcpEnvironment)}


def test_cpu_machines_are_priced_from_their_vcpus_and_memory_at_the_regions_rates_as_googles_rows_say():
    # Rows of the Billing Catalog transcription the rates were solved from, and others they must reproduce.
    assert costs.cpu_price("n2-highmem-80", "us-east4")[0] == pytest.approx(5.90184)
    assert costs.cpu_price("n2-highmem-80", "us-central1")[0] == pytest.approx(N2_HIGHMEM_80)
    assert costs.cpu_price("n2-highmem-32", "us-east1")[0] == pytest.approx(2 * 1.048112)
    assert costs.cpu_price("n2-standard-16", "us-east4")[0] == pytest.approx(0.875024)
    assert costs.cpu_price("e2-standard-4", "us-central1")[0] == pytest.approx(4 * 0.03350571)
    assert costs.cpu_price("e2-highcpu-16", "us-east4")[0] == pytest.approx(0.44575104)  # not in CPU_MACHINES
    price, why = costs.cpu_price("n2-highmem-32", "europe-west4")
    assert price is None and "no list price for n2-highmem-32 in europe-west4" in why
    assert costs.cpu_price("c3-standard-8", "us-central1")[0] is None


def test_every_shipped_spec_has_its_system_pool_and_cluster_fee_priced_in_its_region():
    for name, env in gcp_specs().items():
        rates = {rate.key: rate for rate in pricing.environment_rates(name, env)}
        system = rates[f"node_pool/{env.cluster.system_pool.name}"]
        assert system.usd_per_hour and system.billed == "always", (name, system)
        assert rates[f"cluster/{env.cluster.name}"].usd_per_hour == 0.10
        lustre = rates[f"lustre_instance/{env.lustre.name}"]
        assert f"{env.lustre.capacity_gib:,} GiB at {env.lustre.throughput_mb_per_tib} MB/s/TiB" == lustre.what
        assert rates["functions"].billed == "estimate" and 0 < rates["functions"].usd_per_hour < 0.1


def test_lustre_is_priced_per_gib_month_by_tier_and_an_unknown_tier_says_where_its_price_is():
    rate = costs.resource_rate("lustre_instance/x", {"zone": "us-central1-a", "capacity_gib": 72_000,
                                                     "per_unit_storage_throughput": 125})
    assert rate.usd_per_hour == pytest.approx(72_000 * 0.145 / 730) and rate.billed == "always"
    unknown = costs.resource_rate("lustre_instance/x", {"zone": "us-central1-a", "capacity_gib": 18_000,
                                                        "per_unit_storage_throughput": 500})
    assert unknown.usd_per_hour is None
    assert "500 MB/s/TiB tier in us-central1" in unknown.source and "managed-lustre/pricing" in unknown.source


def test_plan_h200_offline_shows_the_dollars_an_hour_of_what_it_adds(capsys):
    assert cli.main(["plan", "h200", "--offline"]) == 0
    text = capsys.readouterr().out
    cost = text[text.index("Cost at list prices"):]
    lines = {line.split()[1]: line for line in cost.splitlines()[1:] if line.startswith("  + ")}
    assert lines["node_pool/gpu-pool"].rstrip().endswith(f"+${2 * H200_GPU:,.2f}/h")
    assert "2 x a3-ultragpu-8g, reservation h200-reservation" in lines["node_pool/gpu-pool"]
    assert lines["node_pool/default-pool"].rstrip().endswith("+$5.24/h")  # created with the cluster, priced
    assert lines["cluster/rl-h200"].rstrip().endswith("+$0.10/h")
    assert lines["lustre_instance/rl-lustre"].rstrip().endswith("price unknown")
    assert not any(key.startswith(("network/", "subnetwork/", "firewall/")) for key in lines)
    total = 2 * H200_GPU + N2_HIGHMEM_80 + 0.10
    assert f"Total: +${total:,.2f}/h (+${total * 730:,.2f}/month always on, at 730 h)" in cost
    assert "not counted: lustre_instance/rl-lustre, no list price for the 500 MB/s/TiB tier" in cost

    assert cli.main(["plan", "h200", "--offline", "--format", "json"]) == 0
    (plan,) = json.loads(capsys.readouterr().out)
    assert plan["cost"]["usd_per_hour"] == pytest.approx(total) and plan["cost"]["unpriced"] == [
        "lustre_instance/rl-lustre"]


def test_a_plan_prices_what_it_grows_and_removes_and_an_unchanged_one_prices_nothing():
    h200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
    grown = plan_edit("h200", ("autoscaling: {min_nodes: 0, max_nodes: 2}",
                               "autoscaling: {min_nodes: 0, max_nodes: 3}"))
    grown.cost = pricing.plan_cost(grown, h200)
    (change,) = grown.cost.changes
    assert change.key == "node_pool/gpu-pool" and change.sign == "~"
    assert change.usd_per_hour == pytest.approx(H200_GPU)  # one more reserved node, billed always
    text = output.text(grown)
    assert "2 x a3-ultragpu-8g, reservation h200-reservation -> 3 x a3-ultragpu-8g" in text and \
        f"+${H200_GPU:,.2f}/h" in text

    bigger_head = plan_edit("h200", ("machine_type: n2-highmem-80", "machine_type: n2-highmem-96"))
    bigger_head.cost = pricing.plan_cost(bigger_head, h200)
    (change,) = bigger_head.cost.changes  # replaced: the new machine's price less the old one's
    assert change.usd_per_hour == pytest.approx(costs.cpu_price("n2-highmem-96", "us-central1")[0] - N2_HIGHMEM_80)

    live = live_of("h200", h200)
    gone = build_plan("h200", [], live)  # what destroy plans: everything removed
    gone.cost = pricing.plan_cost(gone, h200)
    assert gone.cost.usd_per_hour == pytest.approx(-(2 * H200_GPU + N2_HIGHMEM_80 + 0.10))
    assert "-$169.61/h" in output.text(gone)

    same = plan_edit("h200")
    same.cost = pricing.plan_cost(same, h200)
    assert same.cost.changes == [] and "Cost at list prices" not in output.text(same)
    (comment,) = output.markdown([same])
    assert comment.rstrip().endswith("No changes.")


def test_a_spot_pool_costs_while_up_from_its_ray_workers_and_a_negotiated_rate_replaces_the_list_price():
    env = load_or_raise(ENVIRONMENTS / "a100.yaml")
    (pool,) = env.gpu_pools
    rates = {rate.key: rate for rate in pricing.environment_rates("a100", env)}
    rate = rates[f"node_pool/{pool.name}"]
    assert rate.billed == "while up" and rate.what.startswith(f"{pool.awake_nodes} x a2-ultragpu-8g, spot")
    assert rate.usd_per_hour == pytest.approx(pool.awake_nodes * 16.219747)
    live = {key: Live(fields, True) for key, fields in
            [(f"node_pool/{pool.name}", {"machine_type": "a2-ultragpu-8g", "node_locations": [env.zone],
                                         "spot": True, "min_nodes": 0, "max_nodes": 1})]}
    negotiated = costs.resource_rate(f"node_pool/{pool.name}", live[f"node_pool/{pool.name}"].fields,
                                     costs.PoolHint(replicas=1, usd_per_node_hour=9.5))
    assert negotiated.usd_per_hour == 9.5 and negotiated.source == "the spec's negotiated rate"


@pytest.fixture
def h200_site(gcs):
    env = load_or_raise(ENVIRONMENTS / "h200.yaml")
    bucket = client("rlops-h200-example", Endpoints.from_environment()).create_bucket(f"cost-{uuid.uuid4().hex[:12]}")
    return Site("h200", env, Endpoints.from_environment(), None, bucket, None, None, None, "/lustre", {},
                checkpoints_here=False)


def test_cost_counts_the_whole_environment_over_its_window_and_says_the_window_as_a_person_would(h200_site):
    report = environment_cost.gather(h200_site, until=T0)
    assert report["window_hours"] == 0 and not report["pools"][0]["gpu_hours"]["billed"]
    head = environment_cost.text(report).splitlines()[0]
    assert "no history yet: the reaper's first look at the pool starts it" in head and " to " not in head.split(";")[0]

    status, generation = h200_site.pool.read()
    h200_site.pool.write(PoolStatus(transitions=((T0, "up"), (T0 + 3600, "down"))), generation)
    report = environment_cost.gather(h200_site, until=T0 + 7200)
    others = {row["resource"]: row for row in report["others"]}
    assert set(others) == {"node_pool/default-pool", "cluster/rl-h200", "lustre_instance/rl-lustre", "functions"}
    assert others["node_pool/default-pool"]["usd"] == pytest.approx(2 * N2_HIGHMEM_80)
    assert others["cluster/rl-h200"]["usd"] == pytest.approx(0.20)
    assert others["lustre_instance/rl-lustre"]["usd"] is None
    gpu = 2 * 2 * H200_GPU  # a reservation bills both hours, up or down
    assert report["pools"][0]["usd"]["billed"] == pytest.approx(gpu)
    assert report["total_usd"] == pytest.approx(gpu + 2 * N2_HIGHMEM_80 + 0.20 + others["functions"]["usd"])
    assert report["unpriced"] == ["lustre_instance/rl-lustre"]

    text = environment_cost.text(report)
    assert text.startswith("h200: 2026-09-21 14:13 to 16:13 UTC (2 h 00 min); list prices as of ")
    assert f"total over the window: ${report['total_usd']:,.2f} (GPU pools ${gpu:,.2f}" in text
    assert "not counted, no price known: lustre_instance/rl-lustre" in text
    assert "note: functions: Cloud Run Tier 1 request-based prices" in text  # the estimate says what it assumes
    # from the history
    assert environment_cost.window(T0 - 600, T0 + 150, T0) == "2026-09-21 14:13 to 14:15 UTC (2 min)"
    assert environment_cost.window(T0, T0 + 86_400, T0) == "2026-09-21 14:13 to 2026-09-22 14:13 UTC (24 h 00 min)"
    assert environment_cost.duration(3 * 86400 + 4 * 3600) == "3 d 4 h" and environment_cost.duration(30) == "30 s"
