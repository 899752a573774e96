"""What moving a recipe to another NeMo RL tag changes, before anyone pays for GPUs (`rlops validate --tag`).

For each nemo-rl recipe: the entry point and config the target tag still has (and where upstream moved them), every
override the target refuses or no code of it reads, a rewrite of the recipe where one is known (the v0.6.0 data
section), checked at the target like any recipe, and the difference between the final config a run gets today and
the one it would get at the target. No I/O: the composition reads the shipped configs only.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from rlops.spec import nemo_rl, nemo_rl_data, nemo_rl_unread
from rlops.spec.gcp_sections import GpuPool
from rlops.spec.model import Recipe
from rlops.spec.nemo_rl import Tag
from rlops.spec.source import Finding

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass(frozen=True)
class Move:
    to: str
    since: str
    why: str


# Entry points upstream removed, and what replaced them (NVIDIA-NeMo/RL at the tag named).
ENTRYPOINT_MOVES = {
    "examples/run_grpo_math.py": Move("examples/run_grpo.py", "v0.6.0",
                                      "NVIDIA-NeMo/RL#1841 made run_grpo.py the one GRPO entry point"),
    "examples/run_grpo_rm.py": Move("examples/run_grpo.py", "v0.6.0",
                                    "NVIDIA-NeMo/RL#1841 made run_grpo.py the one GRPO entry point"),
    "examples/run_distillation_math.py": Move("examples/run_distillation.py", "v0.6.0", "renamed at v0.6.0"),
}

# v0.5.0's flat data keys and where v0.6.0's per-dataset layout reads the same thing (v0.5.0's
# load_response_dataset; v0.6.0's setup_response_data and each dataset's constructor). A validation file
# becomes its own entry of the same dataset.
_FLAT_TO_ENTRY = {
    "dataset_name": "train.dataset_name", "train_data_path": "train.data_path", "train_split": "train.split",
    "split": "train.split", "max_samples": "train.max_samples", "val_data_path": "validation.data_path",
    "val_split": "validation.split", "input_key": "default.input_key", "output_key": "default.output_key",
    "prompt_file": "default.prompt_file", "system_prompt_file": "default.system_prompt_file",
    "processor": "default.processor", "env_name": "default.env_name", "chat_key": "default.chat_key",
    "system_key": "default.system_key", "system_prompt": "default.system_prompt", "tool_key": "default.tool_key",
    "use_preserving_dataset": "default.use_preserving_dataset", "download_dir": "default.download_dir",
}

# Datasets that brought their own validation set up to v0.5.0 (DeepScaler: AIME 2024 repeated 16 times,
# deepscaler.py:45-59; DAPOMath17K: BytedTsinghua-SIA/AIME-2024, dapo_math.py:49-50) and from v0.6.0 load
# train only: the entry that validates as before (as examples/configs/grpo_multiple_datasets.yaml does).
_BUNDLED_VALIDATION = {"DeepScaler": {"dataset_name": "AIME2024", "repeat": 16},
                       "DAPOMath17K": {"dataset_name": "DAPOMathAIME2024"}}

@dataclass
class Upgrade:
    recipe: str
    source: str  # the tag the recipe is on today
    target: str
    findings: list[Finding] = field(default_factory=list)  # what the target refuses or reads no more, as the recipe is
    rewrite: dict[str, Any] = field(default_factory=dict)  # the recipe's fields as rewritten for the target
    still_wrong: list[Finding] = field(default_factory=list)  # what the rewrite does not fix
    diff: list[str] = field(default_factory=list)  # final config today -> at the target (rewritten)

    @property
    def changes_meaning(self) -> bool:
        return bool(self.findings or self.diff)


def preview(name: str, recipe: Recipe, pool: GpuPool | None, source: Tag, target: Tag) -> Upgrade:
    upgrade = Upgrade(name, source.name, target.name)
    moved = recipe
    if recipe.entrypoint not in target.examples:
        move = ENTRYPOINT_MOVES.get(recipe.entrypoint)
        if move is not None and move.to in target.examples:
            upgrade.findings.append((("entrypoint",), f"{target.name} has no {recipe.entrypoint} ({move.why}); use "
                                                      f"{move.to}"))
            moved = recipe.model_copy(update={"entrypoint": move.to})
        else:
            upgrade.findings.append((("entrypoint",), f"{target.name} has no {recipe.entrypoint}; name an entry point "
                                                      "the tag has"))
    if recipe.config not in target.configs:
        upgrade.findings.append((("config",), f"{target.name} has no {recipe.config}; pick a config of the tag"))
        return upgrade
    upgrade.findings += _refused_or_unread(moved, pool, target)
    said = {path for path, _ in upgrade.findings + nemo_rl_unread.unread_overrides(source, recipe)}
    upgrade.findings += [(path, message) for path, message in nemo_rl_unread.unread_overrides(target, moved)
                         if path not in said]  # not known unread today, read by no code at the target
    rewritten = _rewrite(moved, source, target)
    upgrade.rewrite = {key: getattr(rewritten, key) for key in ("entrypoint", "overrides", "allowed_overrides")
                       if getattr(rewritten, key) != getattr(recipe, key)}
    upgrade.still_wrong = nemo_rl.check_recipe(rewritten, pool, target)
    before, after = nemo_rl.composed(source, recipe).config, nemo_rl.composed(target, rewritten).config
    if before is not None and after is not None:
        upgrade.diff = diff(before, after)
    return upgrade


def report(upgrade: Upgrade, locate: Callable[[tuple, str], str]) -> list[str]:
    """The preview as lines; `locate` turns a path under the recipe and a message into `file:line:col: field: ...`."""
    head = f"recipes.{upgrade.recipe}: {upgrade.source} -> {upgrade.target}"
    if not upgrade.changes_meaning:
        return [f"{head}: the same final config, nothing refused"]
    lines = [locate(path, message) for path, message in upgrade.findings]
    if upgrade.rewrite:
        verdict = "composes and checks cleanly" if not upgrade.still_wrong else "still wrong, see below"
        lines += [f"{head}: rewritten for {upgrade.target} ({verdict}):",
                  *("  " + line for line in yaml.safe_dump(upgrade.rewrite, sort_keys=False, width=200).splitlines())]
    lines += [locate(path, f"after the rewrite: {message}") for path, message in upgrade.still_wrong]
    if upgrade.diff:
        lines += [f"{head}: the final config a run gets, today -> at {upgrade.target}"
                  + (" (rewritten)" if upgrade.rewrite else "") + ":", *("  " + line for line in upgrade.diff)]
    return lines


def _refused_or_unread(recipe: Recipe, pool: GpuPool | None, tag: Tag) -> list[Finding]:
    """Every override the tag refuses, then what it would read no more from those it takes."""
    refused = nemo_rl.composition_problems(tag, recipe)
    keys = {path[1] for path, _ in refused if len(path) == 2}
    kept = recipe.model_copy(update={section: {k: v for k, v in getattr(recipe, section).items() if k not in keys}
                                     for section in ("overrides", "allowed_overrides")})
    config = nemo_rl.composed(tag, kept).config
    return refused + (nemo_rl.semantics(tag, kept, config, pool) if config is not None else [])


def _rewrite(recipe: Recipe, source: Tag, target: Tag) -> Recipe:
    """The recipe in the target's data layout, where the source's was flat and the target's is per dataset."""
    if nemo_rl_data.LAYOUTS[source.name].per_dataset or not nemo_rl_data.LAYOUTS[target.name].per_dataset \
            or recipe.config is None:
        return recipe
    base = nemo_rl.load_config(target, recipe.config)
    dataset = recipe.default_settings().get("data.dataset_name")

    def moved(section: dict) -> dict:
        out = {}
        for key, value in section.items():
            name = key.lstrip("+").removeprefix("data.")
            if not key.lstrip("+").startswith("data.") or name not in _FLAT_TO_ENTRY:
                out[key] = value
                continue
            new = "data." + _FLAT_TO_ENTRY[name]
            out[_plus_if_new(base, new)] = value
            if new.startswith("data.validation.") and dataset is not None:
                out[_plus_if_new(base, "data.validation.dataset_name")] = dataset
                # v0.5.0 validated on the file it was given; v0.6.0 also carves a share of train unless told not to.
                if "split_validation_size" in nemo_rl_data.LAYOUTS[target.name].datasets.get(dataset, set()):
                    out["data.train.split_validation_size"] = 0
        return out

    overrides = moved(recipe.overrides)
    bundled = _BUNDLED_VALIDATION.get(str(dataset))
    if bundled and not any(key.lstrip("+").startswith("data.validation.") for key in overrides):
        overrides.update({_plus_if_new(base, f"data.validation.{key}"): value for key, value in bundled.items()})
    return recipe.model_copy(update={"overrides": overrides, "allowed_overrides": moved(recipe.allowed_overrides)})


def _plus_if_new(config: "DictConfig", key: str) -> str:
    """Hydra's spelling: `+key` adds a key the config does not have (a null section has none)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 cold start: only composing a nemo-rl recipe needs it

    return key if OmegaConf.select(config, key, default=_ABSENT) is not _ABSENT else "+" + key


_ABSENT = object()


def diff(before: dict, after: dict) -> list[str]:
    """Leaf by leaf: `- key: value` gone, `+ key: value` new, `~ key: old -> new` changed."""
    old, new = _leaves(before), _leaves(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            lines.append(f"- {key}: {_show(old[key])}")
        elif key not in old:
            lines.append(f"+ {key}: {_show(new[key])}")
        elif old[key] != new[key]:
            lines.append(f"~ {key}: {_show(old[key])} -> {_show(new[key])}")
    return lines


def _leaves(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict) and config:
        return {key: value for name, child in config.items()
                for key, value in _leaves(child, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): config}


def _show(value: Any) -> str:
    return json.dumps(value, default=str)
