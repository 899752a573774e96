"""The train message, `{environment, recipe, run, overrides, requested_by}`, and its checks against the spec.

Pure: bytes and a spec in, a TrainMessage or a Poison (with the reason) out. A poison message is
acknowledged and logged by the caller, never retried and never submitted.
"""

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rlops.spec import nemo_rl
from rlops.spec.field_types import DNS_LABEL, OverrideKey, Scalar
from rlops.spec.model import GcpEnvironment, LocalEnvironment, Recipe

MAX_BYTES = 64 * 1024
RunName = Annotated[StrictStr, Field(pattern=DNS_LABEL, min_length=1, max_length=40)]
EnvironmentName = Annotated[StrictStr, Field(pattern=DNS_LABEL, min_length=1, max_length=30)]


class Poison(Exception):
    """A message that can never succeed; the text says why (field path first)."""


class TrainMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    environment: EnvironmentName
    recipe: Annotated[StrictStr, Field(pattern=DNS_LABEL, min_length=1, max_length=63)]
    run: RunName
    overrides: dict[OverrideKey, Scalar] = Field(default_factory=dict, max_length=64)
    requested_by: Annotated[StrictStr, Field(min_length=1, max_length=254, pattern=r"^[\w.@+-]+$")]


def parse(data: bytes) -> TrainMessage:
    if len(data) > MAX_BYTES:
        raise Poison(f"message: {len(data)} bytes, more than the {MAX_BYTES} a train message may have")
    try:
        content = json.loads(data)
    except ValueError as error:  # also bad UTF-8 and integers too long to convert
        raise Poison(f"message: not JSON ({error})") from None
    except RecursionError:
        raise Poison("message: nested too deeply to be a train message") from None
    if not isinstance(content, dict):
        raise Poison(f"message: expected a JSON object, got {type(content).__name__}")
    try:
        return TrainMessage.model_validate(content)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        raise Poison(f"{where}: {first['msg']} ({error.error_count()} problem(s))") from None


class _Addressee(BaseModel):
    environment: EnvironmentName
    run: RunName


def addressee(data: bytes) -> tuple[str, str] | None:
    """(environment, run) of a message refused as a whole, when both are names a valid message could carry: where
    its refusal can be kept. None for anything else."""
    try:
        content = json.loads(data) if len(data) <= MAX_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(content, dict):
        return None
    try:
        named = _Addressee.model_validate({key: content.get(key) for key in ("environment", "run")})
    except ValidationError:
        return None
    return named.environment, named.run


def settings(message: TrainMessage, recipe: Recipe) -> dict[str, Any]:
    """The recipe's fixed overrides, the allowed ones' defaults, then the message's: what the job runs with."""
    for key, value in message.overrides.items():
        allowed = recipe.allowed_overrides.get(key)
        if allowed is None:
            known = ", ".join(sorted(recipe.allowed_overrides)) or "none"
            raise Poison(f"overrides.{key}: not an override recipe {message.recipe} allows (allowed: {known})")
        problem = allowed.problem_with(value)
        if problem:
            raise Poison(f"overrides.{key}: {problem}")
        if recipe.runner == "nemo-rl" and nemo_rl.interpolation_in(value):
            raise Poison(f"overrides.{key}: ${{...}} is an OmegaConf interpolation, which NeMo RL would resolve "
                         "(it could copy the job's environment into the run); send the value itself")
    return {**recipe.default_settings(), **message.overrides}


def recipe_of(message: TrainMessage, env: GcpEnvironment | LocalEnvironment) -> Recipe:
    recipe = env.recipes.get(message.recipe)
    if recipe is None:
        raise Poison(f"recipe: environment {message.environment} has no recipe {message.recipe!r} "
                     f"(it has: {', '.join(sorted(env.recipes))})")
    return recipe
