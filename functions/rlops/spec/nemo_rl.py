"""A nemo-rl recipe's final config, composed as NeMo RL's GRPO example scripts compose it, and checked.

The configs are copies of NVIDIA-NeMo/RL's `examples/**/*.yaml` at each supported tag, shipped in
`nemo_rl_configs/TAG/` with a SOURCE.json naming the commit, every file's blob and the blob of the tag's
`nemo_rl/utils/config.py`, whose version decides how a config composes (`LOADERS`):

- `load_config_with_inheritance`: `OmegaConf.load`, then a `defaults:` key (one path or a list) names
  parents, merged left to right, the child last. Up to v0.5.0 every level resolves its parents against the
  directory of the config named on the command line; from v0.6.0 each parent's own `defaults:` resolve against
  that parent's directory, and a top-level section marked `_override_: true` replaces the parent's section
  instead of merging into it (`merge_with_override`).
- `parse_hydra_overrides` (the same at every tag): struct mode on, Hydra's `OverridesParser`, then
  `ConfigLoaderImpl._apply_overrides_to_config` (a plain key must exist, `+key` must not).
- The GRPO entry point registers its resolvers (`mul`; from v0.6.0 `register_omegaconf_resolvers`: `mul`,
  `div`, `max`) and calls `OmegaConf.to_container(resolve=True)`.

omegaconf 2.3.0 and hydra-core 1.3.2 are the versions every tag's uv.lock pins. What the data section means at
each tag is `nemo_rl_data`'s.
"""

import copy
import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache, lru_cache, partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from rlops.spec import nemo_rl_data
from rlops.spec.gcp_sections import GpuPool
from rlops.spec.model import Recipe
from rlops.spec.source import Finding

if TYPE_CHECKING:
    from omegaconf import DictConfig

WORKDIR = "/opt/nemo-rl"  # where the nemo-rl images hold the repository; its configs name paths relative to it
CONFIGS = Path(__file__).with_name("nemo_rl_configs")
_IMAGE_TAG = re.compile(r"/nemo-rl:(v\d+\.\d+\.\d+)$")


@dataclass(frozen=True)
class Loader:
    """How one version of `nemo_rl/utils/config.py` composes a config."""

    parents_from_own_directory: bool
    override_marker: bool
    resolvers: tuple[str, ...]


# By the git blob of nemo_rl/utils/config.py: v0.4.0 and v0.5.0 share one, v0.6.0 and v0.7.0 the other
# (upstream #1691 `merge_with_override`, #1809 the parent's directory, #1882 and #2188 the resolvers).
LOADERS = {"690c8f164c2a6bede497c82ee034745bd0b67ad5": Loader(False, False, ("mul",)),
           "a911e9289addd14a7a04ec1067a47cc765c3bd2d": Loader(True, True, ("mul", "div", "max"))}
_RESOLVERS = {"mul": lambda a, b: a * b, "div": lambda a, b: a / b, "max": lambda a, b: max(a, b)}

# rlops sets these on every run; a recipe may neither fix nor allow them.
RESERVED = ("checkpointing.checkpoint_dir", "logger.log_dir", "policy.model_name")


@dataclass(frozen=True)
class Tag:
    name: str
    commit: str
    root: Path
    examples: frozenset[str]  # every path under examples/ at the tag
    configs: frozenset[str]  # the ones copied here
    loader: Loader
    prompts: frozenset[str]  # the prompt files copied here (examples/prompts/*.txt)


@cache
def tags() -> dict[str, Tag]:
    found = {}
    for source in sorted(CONFIGS.glob("v*/SOURCE.json"), key=lambda path: _version(path.parent.name)):
        content = json.loads(source.read_text())
        found[content["tag"]] = Tag(content["tag"], content["commit"], source.parent, frozenset(content["examples"]),
                                    frozenset(content["copied"]), LOADERS[content["config_py"]],
                                    frozenset(content["prompts"]))
    return found


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in tag.lstrip("v").split("."))


def tag_of(image: str) -> str | None:
    match = _IMAGE_TAG.search(image)
    return match[1] if match else None


def tag_for(image: str) -> Tag | None:
    """The shipped configs of the NeMo RL image's tag; None when rlops has none."""
    return tags().get(tag_of(image) or "")


def hydra_value(value: Any) -> str:
    """A scalar as Hydra's override grammar reads it back as the same value.

    Strings are always quoted: unquoted, Hydra would read `123` as an int and `true` as a bool.
    Inside quotes Hydra still resolves `${...}`; values carrying one are refused before this. In a quoted
    value Hydra 1.3.2 unescapes only a quote and the backslashes right before one (or before the closing
    quote): those are doubled, every other backslash stays as it is.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + _QUOTE_OR_END.sub(lambda m: m[1] * 2 + ('\\"' if m[2] else ""), value) + '"'


_QUOTE_OR_END = re.compile(r'(\\*)("|$)')


def assignments(recipe: Recipe, settings: dict, checkpoint_dir: str) -> list[tuple[str, Any]]:
    """Every override the job passes, in its order: rlops's own keys, then the settings."""
    return [("checkpointing.checkpoint_dir", checkpoint_dir), ("logger.log_dir", f"{checkpoint_dir}/logs"),
            ("policy.model_name", recipe.model), *sorted(settings.items())]


def words(recipe: Recipe, settings: dict, checkpoint_dir: str) -> list[str]:
    """The command the job runs in WORKDIR."""
    if recipe.config is None:  # the rules refuse such a nemo-rl recipe; it never gets here from a valid spec
        raise ValueError("a nemo-rl recipe needs config")
    return ["uv", "run", "python", recipe.entrypoint, "--config", recipe.config,
            *(f"{key}={hydra_value(value)}" for key, value in assignments(recipe, settings, checkpoint_dir))]


def interpolation_in(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


@dataclass
class Composition:
    config: Any = None  # the resolved final config (plain dicts), when it composed
    problems: list[tuple[str | None, str]] = field(default_factory=list)  # (override key or None, message)


def compose(tag: Tag, config_path: str | None, overrides: list[tuple[str, Any]]) -> Composition:
    """Load the config at the tag, apply `overrides` one at a time (so each problem names its key), resolve: once
    per process for the same overrides, each caller getting its own copy (every spec load composes its recipes
    again, and OmegaConf takes ~0.3 s over a NeMo RL config)."""
    try:
        return copy.deepcopy(_composed_once(tag, config_path, json.dumps(overrides)))
    except TypeError:  # a value JSON cannot carry: composed as it is
        return _composed(tag, config_path, overrides)


@lru_cache(maxsize=256)
def _composed_once(tag: Tag, config_path: str | None, overrides: str) -> Composition:
    return _composed(tag, config_path, [(key, value) for key, value in json.loads(overrides)])


def _composed(tag: Tag, config_path: str | None, overrides: list[tuple[str, Any]]) -> Composition:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl  # noqa: PLC0415 cold start: Hydra takes ~0.4 s
    from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415 cold start: Hydra
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    result = Composition()
    if config_path is None:
        result.problems.append((None, "a nemo-rl recipe needs config, a YAML path inside the image"))
        return result
    try:
        cfg = load_config(tag, config_path)
    except Exception as error:  # any failure to load is reported, as NeMo RL would fail
        result.problems.append((None, f"{config_path} at {tag.name} does not load: {_first_line(error)}"))
        return result
    OmegaConf.set_struct(cfg, True)
    parser = OverridesParser.create()
    for key, value in overrides:
        problem = _type_problem(cfg, key, value)
        if problem:
            result.problems.append((key, problem))
            continue
        try:
            ConfigLoaderImpl._apply_overrides_to_config(
                overrides=parser.parse_overrides([f"{key}={hydra_value(value)}"]), cfg=cfg)
        except Exception as error:  # Hydra's own refusal, reworded
            result.problems.append((key, _hydra_problem(cfg, key, error, tag, config_path)))
    if result.problems:
        return result
    register_resolvers(tag)
    try:
        result.config = OmegaConf.to_container(cfg, resolve=True)
    except Exception as error:
        result.problems.append((None, f"the composed config does not resolve: {_first_line(error)}"))
    return result


def load_config(tag: Tag, config_path: str) -> "DictConfig":
    """The config with its `defaults:` chain, before overrides: a fresh copy of one load per process."""
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    return OmegaConf.create(_loaded(tag.root / config_path, tag.loader))


@cache
def _loaded(path: Path, loader: Loader, base_dir: Path | None = None) -> dict:
    """A config composed with its parents (named relative to `base_dir`, by default its own directory), read once:
    every spec load (validate, each tick, each train message) composes its recipes, and many recipes of a tag share
    their parents (grpo_math_1B.yaml and its own)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    # omegaconf types to_container for any config; a DictConfig's (what _load returns) is a dict.
    return cast(dict, OmegaConf.to_container(_load(path, path.parent if base_dir is None else base_dir, loader),
                                             resolve=False))


def _load(path: Path, base_dir: Path, loader: Loader) -> "DictConfig":
    from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    config = OmegaConf.load(path)
    if not isinstance(config, DictConfig):
        raise ValueError(f"{path.name} is not a mapping")
    if "defaults" in config:
        parents = config.pop("defaults")
        parents = [str(p) for p in parents] if isinstance(parents, ListConfig) else [str(parents)]
        merged = OmegaConf.create({})
        for parent in parents:
            parent_path = Path(parent) if parent.startswith("/") else base_dir / parent
            loaded = OmegaConf.create(_loaded(parent_path, loader, parent_path.parent
                                              if loader.parents_from_own_directory else base_dir))
            merged = _merge(merged, loaded, loader)
        config = _merge(merged, config, loader)
    return config


def _merge(base: "DictConfig", child: "DictConfig", loader: Loader) -> "DictConfig":
    from omegaconf import DictConfig, OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    if loader.override_marker:
        for key in list(child.keys()):
            section = child[key]
            if isinstance(section, DictConfig) and section.get("_override_", False):
                section.pop("_override_")
                if key in base:
                    base.pop(key)
    return cast(DictConfig, OmegaConf.merge(base, child))  # two DictConfigs merge into one; omegaconf types any two


def register_resolvers(tag: Tag) -> None:
    """The resolvers the tag's GRPO entry point registers (OmegaConf's registry is global: once each)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    for name in tag.loader.resolvers:
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, _RESOLVERS[name])


def _type_problem(cfg: "DictConfig", key: str, value: Any) -> str | None:
    """Why `value` does not fit what the config holds at `key` (None: it fits, or the key is new)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing needs it

    if key.startswith("+"):
        return None  # a new key; Hydra refuses it if it is not new
    try:
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # an interpolation that resolves only once the rest is composed
        return None
    if current is None or value is None:
        return None
    if OmegaConf.is_config(current):
        return f"the config has a section here, not a value; set the keys under {key} instead"
    if isinstance(current, bool) != isinstance(value, bool) or not isinstance(
            value, (int, float) if type(current) is float else type(current)):
        return f"the config has {_kind(current)} here ({json.dumps(current)}), not {_kind(value)}; " + (
            "quote it" if isinstance(current, str) else f"give {_kind(current)}")
    return None


def _kind(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a decimal number", str: "a string"}
    return kinds.get(type(value), "a value")


def _hydra_problem(cfg: "DictConfig", key: str, error: Exception, tag: Tag, config_path: str) -> str:
    text = _first_line(error)
    bare = key.lstrip("+")
    if text.startswith("Could not override"):
        near = difflib.get_close_matches(bare, list(_leaf_keys(cfg)), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}?" if near else f"write +{bare} to add it"
        return f"{config_path} at {tag.name} has no key {bare}; {hint}"
    if text.startswith("Could not append"):
        return f"{config_path} at {tag.name} already has {bare}; drop the +"
    return f"Hydra refuses it: {text}"


def _leaf_keys(cfg: "DictConfig", prefix: str = "") -> Iterator[str]:
    from omegaconf import DictConfig  # noqa: PLC0415 cold start: only composing needs it

    for name in cfg.keys():
        node = cfg._get_node(name)
        path = f"{prefix}{name}"
        yield path
        if isinstance(node, DictConfig):  # what OmegaConf.is_dict checks
            yield from _leaf_keys(node, path + ".")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def unsupported(image: str) -> str | None:
    """Why recipes on this image cannot be checked, or None when rlops has its configs."""
    if tag_for(image) is not None:
        return None
    return (f"rlops has no NeMo RL configs for {image} (it has {', '.join(tags())}); this recipe's config and "
            "overrides are not checked")


def check_recipe(recipe: Recipe, pool: GpuPool | None, tag: Tag | None) -> list[Finding]:
    """What is wrong with one nemo-rl recipe at this tag (None: rlops has no configs for the image), each with its
    path under the recipe."""
    problems: list[Finding] = []
    defaults = {key: rule.default for key, rule in recipe.allowed_overrides.items()}
    for section, values in (("overrides", recipe.overrides), ("allowed_overrides", defaults)):
        for key, value in values.items():
            if interpolation_in(value):
                problems.append(((section, key), "an OmegaConf interpolation (${...}) is resolved by NeMo RL when it "
                                                 "loads the config and could copy the job's environment (a token) "
                                                 "into a run name; write the value itself"))
            elif key.lstrip("+") in RESERVED:
                problems.append(((section, key), f"rlops sets {key.lstrip('+')} itself (from checkpoint_root and "
                                                 "the run, or from model); remove it"))
    if tag is None:
        return problems
    for field_name, path in (("entrypoint", recipe.entrypoint), ("config", recipe.config)):
        wanted = tag.configs if field_name == "config" else tag.examples
        if path is not None and str(PurePosixPath(path)) not in wanted:
            near = difflib.get_close_matches(path, sorted(wanted), n=1, cutoff=0.5)
            problems.append(((field_name,), f"{tag.name} has no {path} (under {WORKDIR}, commit {tag.commit[:12]})"
                                            + (f"; did you mean {near[0]}?" if near else "")))
    if problems:
        return problems
    problems = composition_problems(tag, recipe)
    if problems:
        return problems
    return semantics(tag, recipe, composed(tag, recipe).config, pool)


PLACEHOLDER_DIR = "/lustre/RUN"


def composition_problems(tag: Tag, recipe: Recipe) -> list[Finding]:
    """Each override Hydra or the config's types refuse at the tag, with its path under the recipe. Composed with a
    sample value for every allowed override a message may leave out, so that each is checked (its key, its type)."""
    samples = {"int": 1, "float": 1.0, "bool": True, "str": "x"}
    every = {**recipe.overrides, **{key: samples[rule.type] if rule.default is None else rule.default
                                    for key, rule in recipe.allowed_overrides.items()}}
    checked = compose(tag, recipe.config, assignments(recipe, every, PLACEHOLDER_DIR))
    return [(section_of(recipe, key), message) for key, message in checked.problems]


def composed(tag: Tag, recipe: Recipe) -> Composition:
    """What a run whose message sets nothing composes."""
    return compose(tag, recipe.config, assignments(recipe, recipe.default_settings(), PLACEHOLDER_DIR))


def section_of(recipe: Recipe, key: str | None) -> tuple:
    """Where a recipe sets an override key: its path under the recipe (the config itself when it does not)."""
    for section in ("overrides", "allowed_overrides"):
        for candidate in (key, "+" + str(key)):
            if candidate in getattr(recipe, section):
                return (section, candidate)
    return ("config",)


def semantics(tag: Tag, recipe: Recipe, config: dict, pool: GpuPool | None) -> list[Finding]:
    """What NeMo RL at the tag would refuse or quietly ignore, read from the composed config."""
    problems: list[Finding] = []
    at = partial(section_of, recipe)

    tokenizer = (config["policy"].get("tokenizer") or {}).get("name")
    if tokenizer not in (None, recipe.model):
        problems.append((at("policy.tokenizer.name"), f"the tokenizer is {tokenizer}, not the model {recipe.model}; "
                                                       "set policy.tokenizer.name to the model"))
    checkpointing = config.get("checkpointing") or {}
    metric = checkpointing.get("metric_name")
    if checkpointing.get("enabled") and metric is not None and not str(metric).startswith(("train:", "val:")):
        problems.append((at("checkpointing.metric_name"),
                         f"{metric!r}: nemo_rl/algorithms/grpo.py at {tag.name} asserts at the first save that "
                         "metric_name starts with train: or val:; "
                         + ("to Hydra None is that string, not null; write null" if metric == "None" else
                            "use e.g. val:accuracy, or null to keep the latest")))
    cluster = config.get("cluster") or {}
    if pool is not None:
        per_node, nodes = cluster.get("gpus_per_node"), cluster.get("num_nodes")
        if per_node != pool.accelerator.count:
            problems.append((at("cluster.gpus_per_node"), f"{per_node} GPUs per node, but pool {pool.name}'s "
                             f"nodes have {pool.accelerator.count}; set {pool.accelerator.count}"))
        elif isinstance(nodes, int) and nodes > pool.ray_worker_replicas:
            problems.append((at("cluster.num_nodes"), f"{nodes} nodes × {per_node} GPUs, but pool {pool.name} has at "
                                                       f"most {pool.ray_worker_replicas} Ray workers; use at most "
                                                       f"{pool.ray_worker_replicas}"))
    problems += nemo_rl_data.problems(tag.name, recipe, config.get("data") or {}, at, tag.examples, WORKDIR)
    return problems
