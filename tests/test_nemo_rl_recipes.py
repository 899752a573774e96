"""NeMo RL recipes as NeMo RL at the pinned tag reads them: the configs shipped, the job's own words
through Hydra's real parser, and what validate and `train --dry-run` say about them.

The job's override words are applied here with Hydra's `OverridesParser` and
`ConfigLoaderImpl._apply_overrides_to_config` on a struct-mode config, which is what
`nemo_rl/utils/config.py::parse_hydra_overrides` does at v0.4.0 and v0.5.0.
"""

import hashlib
import json

import pytest
import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import ENVIRONMENTS, workload_words
from rlops import cli
from rlops.runs import jobs, message
from rlops.spec import nemo_rl
from rlops.spec.load import load, load_or_raise

H200 = load_or_raise(ENVIRONMENTS / "h200.yaml")
B200 = load_or_raise(ENVIRONMENTS / "b200-spot.yaml")
GEMMA, QWEN = H200.recipes["gemma3-27b-gsm8k"], B200.recipes["qwen25-72b-deepscaler"]


def as_the_job_runs_it(env, recipe, settings: dict, run: str = "r1") -> dict:
    """The config NeMo RL ends up with: the shipped config, then the job command's own override words."""
    request = jobs.request("e", "recipe", recipe, run, settings, "me", 1, "/lustre")
    words = workload_words(request.entrypoint, f"{recipe.checkpoint_root}/{run}")
    assert words[:3] == ["cd", nemo_rl.WORKDIR, "&&"]
    overrides = words[words.index("--config") + 2:]
    cfg = nemo_rl.load_config(nemo_rl.tag_for(env.ray.image), recipe.config)
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(overrides), cfg=cfg)
    nemo_rl._register_resolvers()
    return OmegaConf.to_container(cfg, resolve=True)


def test_every_supported_tag_ships_its_configs_verbatim_with_their_source():
    tags = nemo_rl.tags()
    assert {"v0.4.0", "v0.5.0"} <= set(tags)
    for tag in tags.values():
        source = json.loads((tag.root / "SOURCE.json").read_text())
        assert source["repository"] == "https://github.com/NVIDIA-NeMo/RL" and len(source["commit"]) == 40
        for path in tag.configs:
            assert (tag.root / path).is_file() and path in tag.examples
    assert tags["v0.5.0"].commit.startswith("6c7089300fde") and tags["v0.4.0"].commit.startswith("c751f811217d")
    # Byte for byte upstream's: each file hashes to the git blob id the tag's tree lists for it.
    for tag in tags.values():
        copied = json.loads((tag.root / "SOURCE.json").read_text())["copied"]
        for path, blob in copied.items():
            content = (tag.root / path).read_bytes()
            assert hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest() == blob, path


def test_b200_trains_the_model_its_recipe_names_and_can_checkpoint():
    config = as_the_job_runs_it(B200, QWEN, QWEN.default_settings())
    assert config["policy"]["model_name"] == "Qwen/Qwen2.5-72B-Instruct"  # the config says Llama-3.3-70B
    assert config["policy"]["tokenizer"]["name"] == "Qwen/Qwen2.5-72B-Instruct"
    assert config["checkpointing"]["metric_name"] is None and config["checkpointing"]["enabled"] is True
    assert config["checkpointing"]["checkpoint_dir"] == "/lustre/nemo_rl_qwen_72b_ds_cp/r1"
    assert config["logger"]["log_dir"] == "/lustre/nemo_rl_qwen_72b_ds_cp/r1/logs"
    assert config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"] == 32 * 8
    assert config["cluster"] == {"gpus_per_node": 8, "num_nodes": 8}
    assert config["data"]["dataset_name"] == "DeepScaler"


def test_h200_reads_gsm8k_main_without_a_key_its_loader_ignores():
    config = as_the_job_runs_it(H200, GEMMA, GEMMA.default_settings())
    data = config["data"]
    assert data["dataset_name"] == "ResponseDataset" and "subset" not in data
    read = nemo_rl.LOADER_KEYS["v0.5.0"]["ResponseDataset"]
    assert {k for k in data if k not in yaml.safe_load(
        (nemo_rl.tags()["v0.5.0"].root / "examples/configs/grpo_math_1B.yaml").read_text())["data"]} <= read
    assert data["train_data_path"].endswith("grade_school_math/data/train.jsonl")  # load_dataset("json"): one split
    assert (data["input_key"], data["output_key"]) == ("question", "answer")
    assert config["policy"]["model_name"] == "google/gemma-3-27b-it"
    assert config["policy"]["generation"]["colocated"]["enabled"] is False
    assert config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"] == 16 * 32


def test_validate_composes_the_shipped_environments_cleanly(capsys):
    assert cli.main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "not checked" not in out and out.count(": ok") == 3


@pytest.mark.parametrize("value", ["123", "true", "null", "1e-3", "it's \"quoted\"", "a b;c=d,e"])
def test_a_string_from_a_message_reaches_nemo_rl_as_that_string(value):
    name = message.parse(json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "r1",
                                     "overrides": {"logger.wandb.name": "x"}, "requested_by": "me"}).encode())
    settings = {**message.settings(name, GEMMA), "logger.wandb.name": value}
    assert as_the_job_runs_it(H200, GEMMA, settings)["logger"]["wandb"]["name"] == value


def test_an_interpolation_in_a_message_is_refused_because_nemo_rl_would_resolve_it(monkeypatch):
    # What would happen without the refusal: the real loader copies the job's environment into the name.
    monkeypatch.setenv("HF_TOKEN", "hf_planted")
    leaked = as_the_job_runs_it(H200, GEMMA, {**GEMMA.default_settings(), "logger.wandb.name": "${oc.env:HF_TOKEN}"})
    assert leaked["logger"]["wandb"]["name"] == "hf_planted"
    wide_open = GEMMA.model_copy(update={"allowed_overrides": {
        **GEMMA.allowed_overrides, "logger.wandb.name": GEMMA.allowed_overrides["logger.wandb.name"].model_copy(
            update={"pattern": None})}})
    train = message.parse(json.dumps({"environment": "h200", "recipe": "gemma3-27b-gsm8k", "run": "r1",
                                      "overrides": {"logger.wandb.name": "${oc.env:HF_TOKEN}"},
                                      "requested_by": "me"}).encode())
    with pytest.raises(message.Poison, match=r"overrides.logger.wandb.name: \$\{...\} is an OmegaConf interpolation"):
        message.settings(train, wide_open)


def test_run_grpo_py_is_a_valid_entrypoint_on_v050_and_not_on_v040(tmp_path):
    for source, recipe, image_has_it in (("h200.yaml", "gemma3-27b-gsm8k", True),
                                         ("b200-spot.yaml", "qwen25-72b-deepscaler", False)):
        spec = tmp_path / source
        spec.write_text((ENVIRONMENTS / source).read_text().replace("examples/run_grpo_math.py", "examples/run_grpo.py"))
        problems = [str(p) for p in load(spec).problems]
        assert bool(problems) != image_has_it, problems
        if problems:
            assert f"recipes.{recipe}.entrypoint: v0.4.0 has no examples/run_grpo.py" in problems[0]


def test_an_image_rlops_has_no_configs_for_is_named_and_does_not_block_validate(tmp_path, capsys):
    spec = tmp_path / "h200.yaml"
    spec.write_text((ENVIRONMENTS / "h200.yaml").read_text().replace("nemo-rl:v0.5.0", "nemo-rl:v0.9.9"))
    assert cli.main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "recipes.gemma3-27b-gsm8k.config: not checked: rlops has no NeMo RL configs for " \
           "nvcr.io/nvidia/nemo-rl:v0.9.9 (it has v0.4.0, v0.5.0)" in out and f"{spec}: ok" in out


@pytest.mark.parametrize("env_name,recipe", [("h200", "gemma3-27b-gsm8k"), ("b200-spot", "qwen25-72b-deepscaler")])
def test_train_dry_run_prints_the_job_and_the_composed_config_and_sends_nothing(env_name, recipe, capsys,
                                                                                 monkeypatch):
    from rlops.cloud import pubsub

    monkeypatch.setattr(pubsub, "publish", lambda *a: pytest.fail("a dry run published"))
    assert cli.main(["train", env_name, "--recipe", recipe, "--run", "x", "--dry-run",
                     "--set", "logger.wandb.name=\"123\""]) == 0
    out = capsys.readouterr().out
    head, config_text = out.split("\n---\n")
    job = yaml.safe_load(head)
    env = {"h200": H200, "b200-spot": B200}[env_name]
    the_recipe = env.recipes[recipe]
    assert job["working_directory"] == "/opt/nemo-rl" and " ".join(workload_words(job["entrypoint"])).startswith(
        "cd /opt/nemo-rl && uv run")
    assert job["secrets_by_name_only"] == sorted(env.secrets)
    config = yaml.safe_load(config_text)
    assert config == as_the_job_runs_it(env, the_recipe, {**the_recipe.default_settings(),
                                                          "logger.wandb.name": "123"}, run="x")
    assert config["policy"]["model_name"] == the_recipe.model and config["logger"]["wandb"]["name"] == "123"
    assert config["checkpointing"]["checkpoint_dir"] == f"{the_recipe.checkpoint_root}/x"


def test_the_local_recipes_dry_run_is_its_command(capsys):
    assert cli.main(["train", "local", "--recipe", "tiny-arith", "--run", "x", "--dry-run"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert " ".join(workload_words(job["entrypoint"])).startswith("python -m rlops.workloads.trl_grpo --output-dir ")
    assert job["entrypoint_resources"] == {"gpu_pool": 1}
    assert "---" not in job
