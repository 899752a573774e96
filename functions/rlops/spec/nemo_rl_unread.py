"""The config keys a NeMo RL tag's example configs set that no code of the tag reads, and the recipe overrides of
them: valid, so `rlops validate` warns of them, and `rlops validate --tag` of those only the target tag reads no
more."""

import json
from functools import cache

from rlops.spec.model import Recipe
from rlops.spec.nemo_rl import Tag
from rlops.spec.source import Finding


@cache
def unread_keys(tag: Tag) -> dict[str, dict]:
    """The keys the tag's example configs set that no code of the tag reads, each with the TypedDict of its section
    and the configs that set it: `TAG/UNREAD.json`, derived from the tag's source by tools/vendor_nemo_rl_unread.py
    (its docstring says the rule)."""
    path = tag.root / "UNREAD.json"
    return json.loads(path.read_text())["keys"] if path.is_file() else {}


def unread_overrides(tag: Tag, recipe: Recipe) -> list[Finding]:
    """Each override of a key that no code of the tag reads (`unread_keys`): NeMo RL takes the value and nothing
    changes. Valid, so a warning: the recipe's author believes it does something."""
    found = []
    for section in ("overrides", "allowed_overrides"):
        for key in getattr(recipe, section):
            entry = unread_keys(tag).get(key.lstrip("+"))
            if entry is not None:
                found.append(((section, key), f"no code of NeMo RL {tag.name} reads {key.lstrip('+')} ("
                                              f"{' or '.join(entry['section'])} has no such key and no Python file of "
                                              f"commit {tag.commit[:12]} outside tests names it: nemo_rl_configs/"
                                              f"{tag.name}/UNREAD.json); setting it changes nothing: remove it"))
    return found
