"""Which `data` keys NeMo RL's GRPO data loading reads at each supported tag, and what a recipe sets that it does not.

Two layouts, read from each tag's code (paths and lines at the tag):

- flat, v0.4.0 and v0.5.0: the dataset's keys sit directly under `data`; `load_response_dataset(data_config)`
  (`nemo_rl/data/datasets/response_datasets/__init__.py`) picks a class by `data.dataset_name` and hands it the
  keys named below.
- per dataset, v0.6.0 and v0.7.0: `examples/run_grpo.py` calls `nemo_rl.data.utils.setup_response_data`
  (v0.6.0 utils.py:34-216, v0.7.0 :107-289), which requires `data.train` (a mapping or a list of them), reads
  `data.validation` (null, a mapping or a list) and fills every entry's missing keys from `data.default`
  (`update_single_dataset_config`); each entry goes whole to its class as keyword arguments, and every class takes
  `**kwargs`, so a key it does not name is dropped without a word. Nothing else under `data` names a dataset.
"""

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlops.spec.model import Recipe
from rlops.spec.source import Finding

# Flat layout: the keys each dataset_name reads besides those the base config has (v0.4.0
# response_datasets/__init__.py; ResponseDataset's optional keys go through get_extra_kwargs).
_RESPONSE_DATASET_V04 = {"train_data_path", "val_data_path", "input_key", "output_key", "train_split", "val_split"}
_FLAT_V04 = {
    "open_assistant": set(), "squad": set(), "openmathinstruct2": {"split", "output_key", "prompt_file"},
    "clevr_cogent": {"split", "prompt_file"},
    "openai_format": {"train_data_path", "val_data_path", "chat_key", "system_key", "system_prompt", "tool_key",
                      "use_preserving_dataset"},
    "OpenMathInstruct-2": set(), "DeepScaler": set(), "DAPOMath17K": set(), "clevr-cogent": {"split"},
    "refcoco": {"split", "download_dir"}, "geometry3k": {"split"}, "ResponseDataset": _RESPONSE_DATASET_V04,
}
# v0.5.0 adds two datasets; `set_task_spec` and `set_processor` (raw_dataset.py) read prompt_file,
# system_prompt_file and processor, which the base config has.
_FLAT_V05 = {**_FLAT_V04, "tulu3_sft_mixture": {"test_size", "prompt_file", "max_samples"}, "HelpSteer3": set()}

# Per-dataset layout: every entry's common keys (load_response_dataset reads dataset_name; set_task_spec
# prompt_file and system_prompt_file; set_processor processor; setup_response_data env_name), then each
# class's own named parameters (v0.6.0 response_datasets/__init__.py:46-68 and each class's __init__).
ENTRY_COMMON = frozenset({"dataset_name", "prompt_file", "system_prompt_file", "processor", "env_name"})
_PER_DATASET_V06 = {
    "AIME2024": {"repeat"},  # aime24.py:29
    "clevr-cogent": {"split"},  # clevr.py:69
    "daily-omni": {"split", "split_validation_size", "seed"},  # daily_omni.py:36-42
    "general-conversation-jsonl": {"data_path", "media_data_dir", "split_validation_size", "seed"},  # :191-198
    "DAPOMath17K": set(), "DAPOMathAIME2024": set(), "DeepScaler": set(),  # dapo_math.py:25,54; deepscaler.py:25
    # geometry3k.py:63 helpsteer3.py:30 squad.py:29
    "geometry3k": {"split"}, "HelpSteer3": {"split"}, "squad": {"split"},
    "open_assistant": {"split_validation_size", "seed"},  # oasst.py:97
    "OpenMathInstruct-2": {"output_key", "split", "split_validation_size", "seed"},  # openmathinstruct2.py:32-39
    "refcoco": {"split", "download_dir"},  # refcoco.py:174-178
    "tulu3_sft_mixture": {"split_validation_size", "seed", "max_samples"},  # tulu3.py:31-37
    "gsm8k": {"split", "extract_answer"},  # gsm8k.py:36-42
    "Nemotron-Cascade-2-SFT-Math": {"split", "split_validation_size", "seed", "max_samples"},  # :40-47
    "openai_format": {"data_path", "chat_key", "system_key", "system_prompt", "tool_key",
                      "use_preserving_dataset"},  # oai_format_dataset.py:122-131
    "NemoGymDataset": {"data_path", "repeat"},  # nemogym_dataset.py:28
    "ResponseDataset": {"data_path", "input_key", "output_key", "subset", "split", "split_validation_size",
                        "seed"},  # response_dataset.py:42-52
}
# v0.7.0 registry (response_datasets/__init__.py:53-82): aime.py replaces aime24.py with a variant; GSM8K is an
# alias of gsm8k; four new datasets. A dotted dataset_name ("pkg.module.Class") loads a class of the user's.
_AIME_V07 = {"repeat", "variant"}  # aime.py:34-39
_PER_DATASET_V07 = {
    **_PER_DATASET_V06, "AIME2024": _AIME_V07, "AIME2025": _AIME_V07, "AIME2026": _AIME_V07,
    "GSM8K": _PER_DATASET_V06["gsm8k"],
    "audiomcq": {"split", "split_validation_size", "seed", "max_samples"},  # audiomcq.py:69-76
    "arrow_text": {"data_files", "subset", "split", "text_key", "characters_per_sample", "split_validation_size",
                   "seed"},  # arrow_text_dataset.py:60-70
    "avqa": {"split", "split_validation_size", "seed", "max_samples"},  # avqa.py:78-85
    "mmpr-tiny": {"split", "download_dir", "split_validation_size", "seed"},  # mmpr_tiny.py:186-193
}
# What a dataset cannot load without (its constructor's required parameter).
_REQUIRED = {"ResponseDataset": "data_path", "openai_format": "data_path", "NemoGymDataset": "data_path",
             "general-conversation-jsonl": "data_path", "arrow_text": "data_files"}
# DataConfig's fields (nemo_rl/data/__init__.py:48-74, the same at v0.6.0 and v0.7.0): all that is read under data.
_DATA_FIELDS = frozenset({"max_input_seq_length", "add_bos", "add_eos", "add_generation_prompt", "add_system_prompt",
                          "shuffle", "num_workers", "use_multiple_dataloader", "num_prompts_per_dataloader",
                          "custom_dataloader", "train", "validation", "default"})
ENTRIES = ("train", "validation")


@dataclass(frozen=True)
class DataLayout:
    per_dataset: bool
    datasets: dict[str, set[str]]  # dataset_name -> the keys it reads besides the common ones
    external_classes: bool = False  # a dotted dataset_name names a class of the user's

    def reads(self, dataset: str) -> set[str] | None:
        """The keys an entry of this dataset reads; None when they cannot be known (a class of the user's)."""
        if dataset not in self.datasets:
            return None if self.external_classes and "." in dataset else set()
        return set(self.datasets[dataset]) | (ENTRY_COMMON if self.per_dataset else set())


LAYOUTS = {"v0.4.0": DataLayout(False, _FLAT_V04), "v0.5.0": DataLayout(False, _FLAT_V05),
           "v0.6.0": DataLayout(True, _PER_DATASET_V06), "v0.7.0": DataLayout(True, _PER_DATASET_V07, True)}

# Where, under the recipe, the recipe sets a config key (the config itself when it does not).
Locate = Callable[[str], tuple]


def entries(data: dict) -> dict[str, list[dict]]:
    """The per-dataset layout's train and validation entries, each filled from data.default as NeMo RL fills them."""
    default = data.get("default") or {}
    found = {}
    for section in ENTRIES:
        value = data.get(section)
        listed = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
        found[section] = [{**default, **entry} for entry in listed if isinstance(entry, dict)]
    return found


def problems(tag: str, recipe: Recipe, data: dict, at: Locate, examples: frozenset[str], workdir: str) -> list[Finding]:
    layout = LAYOUTS[tag]
    found = _per_dataset(tag, layout, recipe, data, at) if layout.per_dataset else _flat(tag, layout, recipe, data, at)
    if found:
        return found
    prompts = [data.get("prompt_file")] if not layout.per_dataset else [
        entry.get("prompt_file") for listed in entries(data).values() for entry in listed]
    for prompt in dict.fromkeys(prompts):
        if isinstance(prompt, str) and not prompt.startswith("/") and prompt not in examples:
            near = difflib.get_close_matches(prompt, sorted(examples), n=1, cutoff=0.6)
            found.append((at("data.prompt_file"),
                          f"{tag} has no {prompt} (relative to {workdir}); "
                          + (f"did you mean {near[0]}?" if near else "name a file the image has")))
    return found


def _flat(tag: str, layout: DataLayout, recipe: Recipe, data: dict, at: Locate) -> list[Finding]:
    dataset = data.get("dataset_name")
    if dataset not in layout.datasets:
        return [(at("data.dataset_name"), _unknown_dataset(tag, layout, dataset))]
    found = []
    read = layout.datasets[dataset]
    for section, key in _override_keys(recipe):
        name = key.removeprefix("+data.")
        if key.startswith("+data.") and "." not in name and name not in read:
            found.append(((section, key), f"{tag}'s loader does not read data.{name} for dataset_name {dataset} (it "
                                          f"reads {', '.join(sorted(read)) or 'no extra keys'}); remove it, or pin an "
                                          "image whose loader does"))
    if dataset == "ResponseDataset" and "train_data_path" not in data:
        found.append((at("data.dataset_name"), "ResponseDataset reads its rows from data.train_data_path, which is "
                                               "not set; add +data.train_data_path (a .jsonl path or URL, or a "
                                               "Hugging Face dataset with one config)"))
    return found


def _per_dataset(tag: str, layout: DataLayout, recipe: Recipe, data: dict, at: Locate) -> list[Finding]:
    found: list[Finding] = []
    filled = entries(data)
    if not filled["train"]:
        found.append((at("data.train"), f"{tag}'s setup_response_data needs data.train (a dataset entry, or a list of "
                                        "them); set data.train.dataset_name"))
    readers: dict[str, set[str] | None] = {}  # per section: what its entries read together (None: unknowable)
    for section, listed in filled.items():
        for entry in listed:
            dataset = entry.get("dataset_name")
            read = layout.reads(str(dataset))
            if dataset not in layout.datasets and read is not None:
                found.append((at(f"data.{section}.dataset_name"), _unknown_dataset(tag, layout, dataset)))
                continue
            needed = _REQUIRED.get(str(dataset))
            if needed and entry.get(needed) is None:
                found.append((at(f"data.{section}.dataset_name"),
                              f"{dataset} at {tag} loads its rows from data.{section}.{needed}, which is not set; add "
                              f"+data.{section}.{needed}"))
            known = readers.get(section, set())
            readers[section] = None if read is None or known is None else known | read
    together = [read for read in readers.values() if read is not None]
    readers["default"] = set().union(*together) if len(together) == len(readers) else None
    for section, key in _override_keys(recipe):
        path = key.lstrip("+").split(".")
        if path[0] != "data" or len(path) < 2:
            continue
        reading = readers.get(path[1]) if len(path) == 3 else None  # what the key's entries read (None: unknowable)
        if path[1] not in _DATA_FIELDS:
            found.append(((section, key), f"no code of {tag} reads data.{path[1]}: a dataset's keys sit under "
                                          "data.train, data.validation and data.default there"))
        elif reading is not None and path[2] not in reading:
            sections = filled.values() if path[1] == "default" else [filled[path[1]]]
            names = sorted({str(entry.get("dataset_name")) for listed in sections for entry in listed})
            found.append(((section, key), f"no dataset of data.{path[1]} at {tag} reads {path[2]} ({', '.join(names)} "
                                          f"read {', '.join(sorted(reading))}); NeMo RL would drop it "
                                          "silently: remove it"))
    return found


def _override_keys(recipe: Recipe) -> list[tuple[str, str]]:
    return [(section, key) for section in ("overrides", "allowed_overrides") for key in getattr(recipe, section)]


def _unknown_dataset(tag: str, layout: DataLayout, dataset: Any) -> str:
    near = difflib.get_close_matches(str(dataset), list(layout.datasets), n=1, cutoff=0.5)
    return f"{tag}'s loader has no dataset {dataset!r}; " + (
        f"did you mean {near[0]}?" if near else f"use one of {', '.join(layout.datasets)}")
