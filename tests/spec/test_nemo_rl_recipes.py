"""NeMo RL recipes as NeMo RL at the pinned tag reads them: the configs shipped, the job's own words
through Hydra's real parser, and what validate and `train --dry-run` say about them.

The job's override words are applied here with Hydra's `OverridesParser` and
`ConfigLoaderImpl._apply_overrides_to_config` on a struct-mode config, which is what
`nemo_rl/utils/config.py::parse_hydra_overrides` does at every supported tag (the function is the same at all four).
"""

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor

import pytest
import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from conftest import ENVIRONMENTS, REPO, workload_words
from rlops import cli
from rlops.runs import jobs, message
from rlops.spec import nemo_rl, nemo_rl_data
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
    nemo_rl.register_resolvers(nemo_rl.tag_for(env.ray.image))
    return OmegaConf.to_container(cfg, resolve=True)


def test_every_supported_tag_ships_its_configs_verbatim_with_their_source():
    tags = nemo_rl.tags()
    assert list(tags) == ["v0.4.0", "v0.5.0", "v0.6.0", "v0.7.0"]
    for tag in tags.values():
        source = json.loads((tag.root / "SOURCE.json").read_text())
        assert source["repository"] == "https://github.com/NVIDIA-NeMo/RL" and len(source["commit"]) == 40
        for path in tag.configs:
            assert (tag.root / path).is_file() and path in tag.examples
    assert tags["v0.5.0"].commit.startswith("6c7089300fde") and tags["v0.4.0"].commit.startswith("c751f811217d")
    assert tags["v0.6.0"].commit.startswith("5fb588932bf8") and tags["v0.7.0"].commit.startswith("81aa43dda476")
    # Byte for byte upstream's: each file hashes to the git blob id the tag's tree lists for it.
    for tag in tags.values():
        copied = json.loads((tag.root / "SOURCE.json").read_text())["copied"]
        for path, blob in copied.items():
            content = (tag.root / path).read_bytes()
            assert hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest() == blob, path


@pytest.mark.exhaustive
def test_every_config_of_every_tag_composes_as_that_tags_own_loader_composes_it():
    """tests/golden/nemo_rl_composed.json: for every vendored file, the sha256 of what upstream's own
    `nemo_rl/utils/config.py` at the tag gives (`OmegaConf.to_container(load_config(path), resolve=False)`, JSON with
    sorted keys), or that it fails. Measured with upstream's file (v0.5.0's for v0.4.0: the same blob), which is not
    shipped here; v0.6.0 changed how parents resolve and added `_override_`, and 10 configs at v0.6.0 and 26 at
    v0.7.0 composed differently before rlops followed it."""
    golden = json.loads((REPO / "tests/golden/nemo_rl_composed.json").read_text())
    assert set(golden) == set(nemo_rl.tags())
    for name, tag in nemo_rl.tags().items():
        assert set(golden[name]) == set(tag.configs)
    files = [(name, path) for name, expected_by_path in golden.items() for path in sorted(expected_by_path)]
    with ProcessPoolExecutor(2) as pool:  # OmegaConf's merges take most of a minute for the 680 files, one core
        digests = dict(zip(files, pool.map(_digest, files, chunksize=20), strict=True))
    for (name, path), digest in digests.items():
        expected = golden[name][path]
        assert digest == ("fails" if expected.startswith("error") else expected), f"{name} {path}"
    assert len(digests) > 600


def _digest(file: tuple[str, str]) -> str:
    """What rlops composes from one file of a tag, as the golden file's digest (or "fails")."""
    tag = nemo_rl.tags()[file[0]]
    try:
        return hashlib.sha256(json.dumps(nemo_rl._loaded(tag.root / file[1], tag.loader), sort_keys=True).encode()
                              ).hexdigest()
    except Exception:  # upstream fails on these too (not NeMo RL configs)
        return "fails"


def test_b200_trains_the_model_its_recipe_names_and_can_checkpoint():
    config = as_the_job_runs_it(B200, QWEN, QWEN.default_settings())
    assert config["policy"]["model_name"] == "Qwen/Qwen2.5-72B-Instruct"  # the config says Llama-3.3-70B
    assert config["policy"]["tokenizer"]["name"] == "Qwen/Qwen2.5-72B-Instruct"
    assert config["checkpointing"]["metric_name"] is None and config["checkpointing"]["enabled"] is True
    assert config["checkpointing"]["checkpoint_dir"] == "/lustre/nemo_rl_qwen_72b_ds_cp/r1"
    assert config["logger"]["log_dir"] == "/lustre/nemo_rl_qwen_72b_ds_cp/r1/logs"
    assert config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"] == 32 * 8
    assert {key: config["cluster"][key] for key in ("gpus_per_node", "num_nodes")} == {"gpus_per_node": 8,
                                                                                      "num_nodes": 8}
    assert config["data"]["train"]["dataset_name"] == "DeepScaler"
    assert config["data"]["validation"] == {"dataset_name": "AIME2024", "repeat": 16}


def test_h200_reads_gsm8k_main_without_a_key_its_loader_ignores():
    config = as_the_job_runs_it(H200, GEMMA, GEMMA.default_settings())
    data = config["data"]
    assert data["dataset_name"] == "ResponseDataset" and "subset" not in data
    read = nemo_rl_data.LAYOUTS["v0.5.0"].datasets["ResponseDataset"]
    assert {k for k in data if k not in yaml.safe_load(
        (nemo_rl.tags()["v0.5.0"].root / "examples/configs/grpo_math_1B.yaml").read_text())["data"]} <= read
    # load_dataset("json"): one split; the file its data step writes from GSM8K's own (tests/spec/test_reward_check.py)
    assert data["train_data_path"] == "/lustre/data/gsm8k/train.jsonl"
    assert GEMMA.data_steps[0].source.endswith("grade_school_math/data/train.jsonl")
    assert (data["input_key"], data["output_key"]) == ("question", "answer")
    assert config["policy"]["model_name"] == "google/gemma-3-27b-it"
    assert config["policy"]["generation"]["colocated"]["enabled"] is False
    assert config["grpo"]["num_prompts_per_step"] * config["grpo"]["num_generations_per_prompt"] == 16 * 32


def test_validate_composes_the_shipped_environments_cleanly(capsys):
    assert cli.main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "not checked" not in out and out.count(": ok") == len(list(ENVIRONMENTS.glob("*.yaml")))


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
    h200 = (ENVIRONMENTS / "h200.yaml").read_text().replace("examples/run_grpo_math.py", "examples/run_grpo.py")
    for image, ray, image_has_it in (("v0.5.0", "2.49.2", True), ("v0.4.0", "2.46.0", False)):
        spec = tmp_path / "h200.yaml"
        spec.write_text(h200.replace("nemo-rl:v0.5.0", f"nemo-rl:{image}").replace('"2.49.2"', f'"{ray}"'))
        problems = [str(p) for p in load(spec).problems]
        assert bool(problems) != image_has_it, problems
        if problems:
            assert "recipes.gemma3-27b-gsm8k.entrypoint: v0.4.0 has no examples/run_grpo.py" in problems[0]


def test_an_image_rlops_has_no_configs_for_is_named_and_does_not_block_validate(tmp_path, capsys):
    spec = tmp_path / "h200.yaml"
    spec.write_text((ENVIRONMENTS / "h200.yaml").read_text().replace("nemo-rl:v0.5.0", "nemo-rl:v0.9.9"))
    assert cli.main(["validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "recipes.gemma3-27b-gsm8k.config: not checked: rlops has no NeMo RL configs for " \
           "nvcr.io/nvidia/nemo-rl:v0.9.9 (it has v0.4.0, v0.5.0, v0.6.0, v0.7.0)" in out and f"{spec}: ok" in out


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


def test_validate_tag_names_what_v060_no_longer_reads_and_the_rewrite_that_composes_there(capsys):
    """h200's v0.5.0 recipe at v0.6.0: run_grpo_math.py is gone, data.dataset_name is no key, the four flat data keys
    compose (they are new keys) but no code reads them; the rewrite is checked at v0.6.0 like any recipe."""
    spec = ENVIRONMENTS / "h200.yaml"
    assert cli.main(["validate", str(spec), "--tag", "v0.6.0"]) == 2
    out = capsys.readouterr().out
    lines = {line.split(": ", 2)[1]: line for line in out.splitlines() if line.startswith(f"{spec}:") and ": " in line}
    assert "use examples/run_grpo.py" in lines["recipes.gemma3-27b-gsm8k.entrypoint"]
    assert "did you mean data.train.dataset_name?" in lines['recipes.gemma3-27b-gsm8k.overrides["data.dataset_name"]']
    for key in ("train_data_path", "val_data_path", "input_key", "output_key"):
        line = lines[f'recipes.gemma3-27b-gsm8k.overrides["+data.{key}"]']
        assert f"no code of v0.6.0 reads data.{key}" in line
        assert line.startswith(f"{spec}:{_line_of(spec, f'+data.{key}:')}:"), line
    assert "rewritten for v0.6.0 (composes and checks cleanly):" in out
    rewrite = yaml.safe_load(out.split("(composes and checks cleanly):\n")[1].split("\nrecipes.")[0])
    assert rewrite["entrypoint"] == "examples/run_grpo.py"
    data = {key: value for key, value in rewrite["overrides"].items() if "data." in key}
    assert data == {"data.train.dataset_name": "ResponseDataset",
                    "+data.train.data_path": GEMMA.overrides["+data.train_data_path"],
                    "+data.validation.dataset_name": "ResponseDataset",
                    "+data.validation.data_path": GEMMA.overrides["+data.val_data_path"],
                    "data.train.split_validation_size": 0,
                    "+data.default.input_key": "question", "+data.default.output_key": "answer"}
    # The diff of the final configs names upstream's own default changes too.
    assert "~ policy.logprob_batch_size: 2 -> 4" in out and '- data.train_data_path: "/lustre/data/gsm8k/' in out

    # The rewrite, applied, is a v0.6.0 recipe that validates and previews as unchanged.
    moved = GEMMA.model_copy(update=rewrite)
    tag = nemo_rl.tags()["v0.6.0"]
    assert nemo_rl.check_recipe(moved, H200.gpu_pools[0], tag) == []
    config = nemo_rl.composed(tag, moved).config["data"]
    assert config["train"]["data_path"].endswith("/train.jsonl") and config["validation"]["data_path"].endswith(
        "/test.jsonl")
    assert (config["default"]["input_key"], config["default"]["output_key"]) == ("question", "answer")


def _line_of(spec, text: str) -> int:
    return next(number for number, line in enumerate(spec.read_text().splitlines(), 1) if text in line)


def test_validate_tag_exits_0_when_the_final_config_is_the_same_and_1_for_a_tag_rlops_lacks(capsys):
    assert cli.main(["validate", str(ENVIRONMENTS / "b200-spot.yaml"), "--tag", "v0.7.0"]) == 0
    assert "recipes.qwen25-72b-deepscaler: v0.7.0 -> v0.7.0: the same final config" in capsys.readouterr().out
    assert cli.main(["validate", str(ENVIRONMENTS / "h200.yaml"), "--tag", "v0.8.0"]) == 1
    assert "--tag v0.8.0: rlops has the configs of NeMo RL v0.4.0, v0.5.0, v0.6.0, v0.7.0" in capsys.readouterr().err


def test_a_dataset_key_of_the_per_dataset_layout_that_no_dataset_reads_is_named(tmp_path, capsys):
    """At v0.6.0 every dataset class takes **kwargs: a key it does not name is dropped without a word."""
    spec = tmp_path / "b200-spot.yaml"
    spec.write_text((ENVIRONMENTS / "b200-spot.yaml").read_text().replace(
        "      +data.validation.repeat: 16\n", "      +data.validation.repeat: 16\n      +data.train.input_key: q\n"))
    assert cli.main(["validate", str(spec)]) == 2
    out = capsys.readouterr().out
    assert 'overrides["+data.train.input_key"]: no dataset of data.train at v0.7.0 reads input_key (DeepScaler' in out


def test_the_v040_deepscaler_recipe_is_rewritten_with_the_validation_set_it_brought_along():
    """Up to v0.5.0 DeepScaler validated on AIME 2024 ×16 by itself; from v0.6.0 that is an entry of its own."""
    from rlops.spec import nemo_rl_upgrade

    v04 = QWEN.model_copy(update={"entrypoint": "examples/run_grpo_math.py", "overrides": {
        **{k: v for k, v in QWEN.overrides.items() if "data." not in k}, "data.dataset_name": "DeepScaler"}})
    tags = nemo_rl.tags()
    upgrade = nemo_rl_upgrade.preview("q", v04, B200.gpu_pools[0], tags["v0.4.0"], tags["v0.7.0"])
    assert upgrade.changes_meaning and upgrade.still_wrong == []
    assert upgrade.rewrite["entrypoint"] == "examples/run_grpo.py"
    assert {k: v for k, v in upgrade.rewrite["overrides"].items() if "data." in k} == {
        "data.train.dataset_name": "DeepScaler", "+data.validation.dataset_name": "AIME2024",
        "+data.validation.repeat": 16}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab\\\"' =,:[]{}$()#é\t")) | st.characters(), max_size=40))
def test_every_string_reaches_hydra_as_that_string(value):
    """Issue 32: hydra_value doubled every backslash, which Hydra 1.3.2 unescapes only before a quote; a Windows
    path or a regex reached NeMo RL with twice its backslashes."""
    assume("${" not in value)  # refused before a value reaches the command (an interpolation NeMo RL resolves)
    parsed = OverridesParser.create().parse_overrides([f"k={nemo_rl.hydra_value(value)}"])[0]
    assert parsed.value() == value


def test_the_table_of_keys_no_code_reads_is_the_tags_own_and_cites_where_each_key_is_set():
    """Issue 32, 5: `TAG/UNREAD.json` (tools/vendor_nemo_rl_unread.py, from a checkout of each tag) names the commit the
    configs are of, and each key is set where it says, in the configs shipped from that commit. converter_type, which
    b200's recipe set at v0.4.0, is in every tag's: no code of NeMo RL reads it at any of them."""
    for tag in nemo_rl.tags().values():
        table = json.loads((tag.root / "UNREAD.json").read_text())
        assert (table["tag"], table["commit"]) == (tag.name, tag.commit)
        assert "policy.megatron_cfg.converter_type" in table["keys"]
        for key, entry in table["keys"].items():
            assert entry["section"] and 1 <= len(entry["set_in"]) <= entry["configs"]
            for place in entry["set_in"]:
                path, line = place.rsplit(":", 1)
                text = (tag.root / path).read_text().splitlines()[int(line) - 1]
                assert text.lstrip().startswith(key.rsplit(".", 1)[1] + ":"), (tag.name, key, place, text)


def test_validate_warns_on_an_override_no_code_of_the_tag_reads_naming_file_line_and_key(tmp_path, capsys):
    """The spec stays valid (NeMo RL takes the key): a warning at the override's line, for v0.5.0's h200 (the config
    has converter_type) and v0.7.0's b200 (it is added with +)."""
    h200 = tmp_path / "h200.yaml"
    h200.write_text((ENVIRONMENTS / "h200.yaml").read_text().replace(
        "    overrides:\n", "    overrides:\n      policy.megatron_cfg.converter_type: Gemma3ForCausalLM\n", 1))
    b200 = tmp_path / "b200-spot.yaml"
    b200.write_text((ENVIRONMENTS / "b200-spot.yaml").read_text().replace(
        "    overrides:\n", "    overrides:\n      +policy.megatron_cfg.converter_type: Qwen2ForCausalLM\n", 1))
    for spec, tag, key in ((h200, "v0.5.0", "policy.megatron_cfg.converter_type"),
                           (b200, "v0.7.0", "+policy.megatron_cfg.converter_type")):
        assert cli.main(["validate", str(spec)]) == 0
        out = capsys.readouterr().out
        warned = [line for line in out.splitlines() if ": warning: " in line]
        line = _line_of(spec, f"{key}:")
        assert len(warned) == 1 and warned[0].startswith(f"{spec}:{line}:"), out
        assert f'.overrides["{key}"]: warning: no code of NeMo RL {tag} reads policy.megatron_cfg.converter_type' \
               f" (MegatronConfig (nemo_rl/models/policy/__init__.py:" in warned[0]
        assert f"no Python file of commit {nemo_rl.tags()[tag].commit[:12]} outside tests names it" in warned[0]
        assert f"{spec}: ok" in out
    # A key v0.5.0's table does not have and v0.6.0's does: said by the upgrade preview, not by validate today.
    h200.write_text((ENVIRONMENTS / "h200.yaml").read_text().replace(
        "    overrides:\n", "    overrides:\n      +grpo.num_val_generations_per_prompt: 4\n", 1))
    assert cli.main(["validate", str(h200)]) == 0
    assert ": warning: " not in capsys.readouterr().out
    assert cli.main(["validate", str(h200), "--tag", "v0.6.0"]) == 2
    assert 'overrides["+grpo.num_val_generations_per_prompt"]: no code of NeMo RL v0.6.0 reads ' \
           "grpo.num_val_generations_per_prompt (GRPOConfig" in capsys.readouterr().out


def test_a_composition_is_made_once_per_process_and_each_caller_changes_only_its_own_copy():
    tag = nemo_rl.tags()["v0.5.0"]
    overrides = [("grpo.max_num_steps", 7), ("policy.model_name", "Qwen/Qwen2.5-1.5B")]
    first = nemo_rl.compose(tag, "examples/configs/grpo_math_1B.yaml", overrides)
    assert first.config["grpo"]["max_num_steps"] == 7 and not first.problems
    first.config["grpo"]["max_num_steps"] = 99  # a caller that edits what it got
    again = nemo_rl.compose(tag, "examples/configs/grpo_math_1B.yaml", overrides)
    assert again.config["grpo"]["max_num_steps"] == 7 and again.config is not first.config
    other = nemo_rl.compose(tag, "examples/configs/grpo_math_1B.yaml", [("grpo.max_num_steps", 8)])
    assert other.config["grpo"]["max_num_steps"] == 8
    refused = nemo_rl.compose(tag, "examples/configs/grpo_math_1B.yaml", [("grpo.no_such_key", 1)])
    assert [key for key, _ in refused.problems] == ["grpo.no_such_key"] and refused.config is None
