import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlops import cli
from rlops.spec.load import json_schema, load
from rlops.spec.model import GcpEnvironment, LocalEnvironment

ENVIRONMENTS = Path(__file__).resolve().parent.parent / "environments"
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
def test_each_environment_starts_with_the_schema_line(path):
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=./schema.json"


def test_committed_schema_is_what_rlops_schema_prints(capsys):
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((ENVIRONMENTS / "schema.json").read_text()), "run `make schema`"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_json_schema_accepts_each_environment(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), json_schema())


def test_json_schema_rejects_unknown_keys_and_wrong_provider():
    spec = yaml.safe_load((ENVIRONMENTS / "local.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**spec, "colour": "blue"}, json_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**spec, "provider": "aws"}, json_schema())


def test_h200_is_the_first_seed():
    env = load(ENVIRONMENTS / "h200.yaml").environment
    assert isinstance(env, GcpEnvironment)
    pool = env.gpu_pools[0]
    assert (pool.machine_type, pool.accelerator.type, pool.accelerator.count) == ("a3-ultragpu-8g", "nvidia-h200-141gb", 8)
    assert pool.reservation and not pool.spot
    assert (pool.autoscaling.min_nodes, pool.autoscaling.max_nodes) == (0, 2)
    assert len(env.networks.rdma.subnet_cidrs) == 8
    assert (env.lustre.capacity_gib, env.lustre.throughput_mb_per_tib, env.lustre.filesystem) == (18000, 500, "lustrefs")
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
    assert (fixed["policy.train_global_batch_size"], fixed["checkpointing.save_period"], fixed["checkpointing.keep_top_k"]) == (256, 2, 2)
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
    """Issue 39, 7: an editor shows a description on every key; a key whose value is another model is described
    there, by that model's own description."""
    schema = json.loads((ENVIRONMENTS / "schema.json").read_text())
    models = schema.get("$defs", {})

    def undescribed(node: dict, where: str):
        for key, value in node.get("properties", {}).items():
            target = models.get(value.get("$ref", "").rsplit("/", 1)[-1], {})
            if "description" not in value and "description" not in target:
                yield f"{where}.{key}"

    missing = [found for name, model in models.items() for found in undescribed(model, name)]
    assert missing == [], missing
