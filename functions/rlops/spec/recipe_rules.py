"""Rules about the recipes of a structurally valid spec: their overrides, exports, drivers, paths and pools, and for
nemo-rl recipes what the image's NeMo RL composes, reads and cannot check.

Each rule yields `(path, message)` pairs, as `rules.py`'s do. No I/O: these are facts about the spec alone.
"""

import re
from collections.abc import Iterator

from rlops.spec import nemo_rl, nemo_rl_unread
from rlops.spec.gcp_sections import GpuPool
from rlops.spec.model import AllowedOverride, GcpEnvironment, LocalEnvironment, Recipe
from rlops.spec.source import Finding, SpecPath


def recipes(env: GcpEnvironment | LocalEnvironment) -> Iterator[Finding]:
    gcp = isinstance(env, GcpEnvironment)
    pools = [pool.name for pool in env.gpu_pools] if gcp else []
    for name, recipe in env.recipes.items():
        at = ("recipes", name)
        for key in recipe.overrides.keys() & recipe.allowed_overrides.keys():
            yield at + ("allowed_overrides", key), (
                f"{key} is both fixed in overrides and allowed in a train message; keep it in one of the two")
        for key, rule in recipe.allowed_overrides.items():
            yield from _allowed_override(rule, at + ("allowed_overrides", key))
        if recipe.export.when == "every" and recipe.export.every is None:
            yield at + ("export", "when"), "when: every needs a count; add every: N to export every N-th checkpoint"
        elif recipe.export.when != "every" and recipe.export.every is not None:
            yield at + ("export", "every"), ("every: N goes with when: every; remove it, or set when: every "
                                             f"(this export is when: {recipe.export.when})")
        if recipe.runner == "nemo-rl":
            if not gcp:
                yield at + ("runner",), "nemo-rl needs GPU nodes and its image; the local environment runs runner: trl"
            if recipe.driver == "gpu-pool":
                yield at + ("driver",), ("NeMo RL's driver runs on the head and starts its GPU workers as Ray actors; "
                                         "remove driver")
            if recipe.config is None:
                yield at + ("config",), "nemo-rl needs --config; set config to a YAML path inside the image"
            if gcp and recipe.config is not None:
                for path, message in nemo_rl.check_recipe(recipe, pool_of(env, recipe), nemo_rl.tag_for(env.ray.image)):
                    yield at + path, message
        elif recipe.driver == "head" and gcp:
            yield at + ("driver",), ("a trl recipe plays NeMo RL's driver on the head of the local stack only, where "
                                     "the GPU pool's resource stands for GPUs; on GKE use runner: nemo-rl")
        if gcp:
            mount = env.ray.lustre_mount.rstrip("/") + "/"
            if not recipe.checkpoint_root.startswith(mount):
                yield at + ("checkpoint_root",), (
                    f"{recipe.checkpoint_root} is not on Lustre ({env.ray.lustre_mount}); checkpoints there are lost "
                    f"with the pod. Use e.g. {mount}checkpoints")
            written = set()
            for index, step in enumerate(recipe.data_steps):
                if not step.path.startswith(mount):
                    yield at + ("data_steps", index, "path"), (
                        f"{step.path} is not on Lustre ({env.ray.lustre_mount}); the gate writes it on the head pod, "
                        f"where it is lost with the pod. Use e.g. {mount}data/{step.path.rsplit('/', 1)[-1]}")
                elif step.path in written:
                    yield at + ("data_steps", index, "path"), (
                        f"an earlier data step writes {step.path}; name another file")
                written.add(step.path)
            if recipe.gpu_pool is None and len(pools) > 1:
                yield at, f"there are {len(pools)} GPU pools; set gpu_pool to one of {', '.join(pools)}"
            elif recipe.gpu_pool is not None and recipe.gpu_pool not in pools:
                yield at + ("gpu_pool",), f"no GPU pool named {recipe.gpu_pool}; use one of {', '.join(pools)}"
        elif recipe.gpu_pool is not None and recipe.gpu_pool != env.local.gpu_pool.name:
            yield at + ("gpu_pool",), f"the local GPU pool is {env.local.gpu_pool.name}; use that or leave it unset"


def _allowed_override(rule: AllowedOverride, path: SpecPath) -> Iterator[Finding]:
    numeric = rule.type in ("int", "float")
    for bound in ("min", "max"):
        value = getattr(rule, bound)
        if value is None:
            continue
        if not numeric:
            yield path + (bound,), f"{bound} applies to int and float overrides, not {rule.type}; remove it"
        elif rule.type == "int" and not isinstance(value, int):
            yield path + (bound,), f"an int override needs a whole-number {bound}; use {int(value)}"
    if numeric and rule.min is not None and rule.max is not None and rule.min > rule.max:
        yield path + ("min",), f"min {rule.min} is above max {rule.max}; make min <= max"
    if rule.pattern is not None:
        if rule.type != "str":
            yield path + ("pattern",), f"pattern applies to str overrides, not {rule.type}; remove it"
        else:
            try:
                re.compile(rule.pattern)
            except re.error as error:
                yield path + ("pattern",), f"not a valid regular expression ({error}); fix the pattern"
                return
    if rule.default is not None:
        problem = rule.problem_with(rule.default)
        if problem:
            yield path + ("default",), f"the default breaks its own rule: {problem}; change the default or the rule"


def pool_of(env: GcpEnvironment, recipe: Recipe) -> GpuPool | None:
    named = [pool for pool in env.gpu_pools if pool.name == recipe.gpu_pool or recipe.gpu_pool is None]
    return named[0] if len(named) == 1 else None


def notices(env: GcpEnvironment | LocalEnvironment) -> list[Finding]:
    """What could not be checked; it does not make the spec invalid."""
    if not isinstance(env, GcpEnvironment):
        return []
    reason = nemo_rl.unsupported(env.ray.image)
    return [(("recipes", name, "config"), reason) for name, recipe in env.recipes.items()
            if recipe.runner == "nemo-rl" and reason]


def warnings(env: GcpEnvironment | LocalEnvironment) -> list[Finding]:
    """What is valid but does not do what it says: overrides of keys no code of the image's NeMo RL reads."""
    tag = nemo_rl.tag_for(env.ray.image) if isinstance(env, GcpEnvironment) else None
    if tag is None:
        return []
    return [(("recipes", name) + path, message) for name, recipe in env.recipes.items() if recipe.runner == "nemo-rl"
            for path, message in nemo_rl_unread.unread_overrides(tag, recipe)]
