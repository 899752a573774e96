import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlops import cli
from rlops.spec.load import load
from rlops.spec.model import GcpEnvironment, LocalEnvironment

ENVIRONMENTS = Path(__file__).resolve().parent.parent.parent / "environments"
SPECS = sorted(ENVIRONMENTS.glob("*.yaml"))


def test_the_three_seed_environments_are_there():
    assert {p.stem for p in SPECS} >= {"local", "h200", "b200-spot"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_each_environment_is_valid(path):
    loaded = load(path)
    assert loaded.problems == []
    assert loaded.environment is not None


def test_validate_with_no_arguments_checks_every_environment(monkeypatch, capsys):
    monkeypatch.chdir(ENVIRONMENTS.parent)
    assert cli.main(["validate"]) == 0
    out = capsys.readouterr().out
    assert all(f"environments/{p.name}: ok" in out for p in SPECS)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_describe_summarises_each_environment(path, capsys):
    # Each machine family has its own GPU NIC networks (or none): the summary names those the spec has.
    assert cli.main(["validate", str(path), "--describe"]) == 0
    out = capsys.readouterr().out
    assert f"environment {path.stem} (" in out
    env = load(path).environment
    if isinstance(env, GcpEnvironment):
        (networks,) = [line for line in out.splitlines() if line.startswith("  networks: ")]
        named = {name for name in ("gvnic", "rdma", "gpu_nics") if getattr(env.networks, name)}
        assert ("gvnic-net" in networks, "rdma-net" in networks, "one per GPU NIC" in networks) == (
            "gvnic" in named, "rdma" in named, "gpu_nics" in named)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_each_environment_starts_with_the_schema_line(path):
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=./schema.json"


def test_committed_schema_is_what_rlops_schema_prints(capsys):
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((ENVIRONMENTS / "schema.json").read_text()), "run `make schema`"


def _schema_errors(spec: dict) -> list[tuple[list, str, str]]:
    """What an editor's validator reports on `spec` under the committed schema: (path, keyword, message) each."""
    schema = json.loads((ENVIRONMENTS / "schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [(list(e.absolute_path), e.validator, e.message) for e in validator.iter_errors(spec)]


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_json_schema_accepts_each_environment(path):
    assert _schema_errors(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize("name, change, path", [
    ("local.yaml", lambda spec: spec.update(idle={"timout": "30s"}), ["idle"]),
    ("local.yaml", lambda spec: spec.update(colour="blue"), []),
    ("h200.yaml", lambda spec: spec["gpu_pools"][0]["autoscaling"].update(max_node=3), ["gpu_pools", 0, "autoscaling"]),
    ("h200.yaml", lambda spec: spec["idle"].update(timout="30s"), ["idle"]),
], ids=["local-idle", "local-root", "gcp-pool-autoscaling", "gcp-idle"])
def test_json_schema_reports_an_unknown_key_where_it_is(name, change, path):
    """Issue 39, 7: under pydantic's bare oneOf a typo anywhere was "not valid under any of the given schemas" at the
    root; an editor must point at the key itself."""
    spec = yaml.safe_load((ENVIRONMENTS / name).read_text())
    change(spec)
    [(where, keyword, message)] = _schema_errors(spec)
    assert (where, keyword) == (path, "additionalProperties")
    assert "was unexpected" in message


def test_json_schema_reports_a_wrong_or_missing_provider_at_provider():
    spec = yaml.safe_load((ENVIRONMENTS / "h200.yaml").read_text())
    wrong = _schema_errors({**spec, "provider": "aws"})
    assert wrong == [(["provider"], "enum", "'aws' is not one of ['gcp', 'local']")]
    spec.pop("provider")
    assert _schema_errors(spec) == [([], "required", "'provider' is a required property")]


def test_h200_is_the_first_seed():
    env = load(ENVIRONMENTS / "h200.yaml").environment
    assert isinstance(env, GcpEnvironment)
    pool = env.gpu_pools[0]
    assert (pool.machine_type, pool.accelerator.type, pool.accelerator.count) == (
        "a3-ultragpu-8g", "nvidia-h200-141gb", 8)
    assert pool.reservation and not pool.spot
    assert (pool.autoscaling.min_nodes, pool.autoscaling.max_nodes) == (0, 2)
    assert len(env.networks.rdma.subnet_cidrs) == 8
    assert (env.lustre.capacity_gib, env.lustre.throughput_mb_per_tib, env.lustre.filesystem) == (
        18000, 500, "lustrefs")
    assert env.lustre.deletion_policy == "retain"
    recipe = env.recipes["gemma3-27b-gsm8k"]
    assert recipe.overrides["grpo.num_prompts_per_step"] == 16
    assert recipe.overrides["grpo.num_generations_per_prompt"] == 32
    assert recipe.overrides["policy.generation.colocated.enabled"] is False
    assert env.ray.image == "nvcr.io/nvidia/nemo-rl:v0.5.0" and env.ray.ray_version == "2.49.2"


def test_b200_is_the_second_seed():
    env = load(ENVIRONMENTS / "b200-spot.yaml").environment
    pool = env.gpu_pools[0]
    assert (pool.machine_type, pool.accelerator.type) == ("a4-highgpu-8g", "nvidia-b200")
    assert pool.spot and pool.reservation is None and pool.ray_worker_replicas == 8
    recipe = env.recipes["qwen25-72b-deepscaler"]
    assert recipe.model == "Qwen/Qwen2.5-72B-Instruct"
    fixed = recipe.overrides
    assert (fixed["grpo.num_generations_per_prompt"], fixed["grpo.num_prompts_per_step"]) == (8, 32)
    assert (fixed["policy.train_global_batch_size"], fixed["checkpointing.save_period"],
            fixed["checkpointing.keep_top_k"]) == (256, 2, 2)
    assert recipe.allowed_overrides["grpo.max_num_steps"].default == 20
    # The codelab's v0.4.0 recipe, moved to NeMo RL v0.7.0 (whose uv.lock pins Ray 2.55.1) as `validate --tag` said.
    assert env.ray.image == "nvcr.io/nvidia/nemo-rl:v0.7.0" and env.ray.ray_version == "2.55.1"
    assert recipe.entrypoint == "examples/run_grpo.py" and fixed["data.train.dataset_name"] == "DeepScaler"


def test_local_is_the_embedded_default_with_a_short_idle_timeout():
    env = load(ENVIRONMENTS / "local.yaml").environment
    assert isinstance(env, LocalEnvironment)
    assert env.idle.timeout_seconds <= 300
    assert {r.runner for r in env.recipes.values()} == {"trl"}


def test_every_property_of_the_schema_says_what_it_is():
    """Issue 39, 7: an editor shows a description on every key, at every depth, the key's own (a model's description,
    on its definition, says what the model is, not what the key is for; pydantic drops a key's description that
    repeats it)."""
    schema = json.loads((ENVIRONMENTS / "schema.json").read_text())

    def undescribed(node, where: str):
        if isinstance(node, list):
            for index, item in enumerate(node):
                yield from undescribed(item, f"{where}[{index}]")
        elif isinstance(node, dict):
            for key, value in node.get("properties", {}).items():
                if not str(value.get("description", "")).strip():
                    yield f"{where}.properties.{key}"
            for key, value in node.items():
                if key not in ("default", "enum", "const", "if"):  # values, and the guard that picks a provider
                    yield from undescribed(value, f"{where}.{key}")

    properties = sum(len(model.get("properties", {})) for model in schema["$defs"].values())
    assert properties > 130 and "provider" in schema["properties"]
    assert list(undescribed(schema, "#")) == []
