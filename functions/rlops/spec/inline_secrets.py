"""Finding secret values pasted into a spec, which must only hold references to them."""

import re
from collections.abc import Iterator
from typing import Any

_SHAPES = [
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("W&B API key", re.compile(r"(?<![0-9a-fA-F])[0-9a-f]{40}(?![0-9a-fA-F])")),
    ("PEM block (a private key or certificate)", re.compile(r"-----BEGIN [A-Z0-9 ]+-----")),
    ("GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
]


def secret_kind(text: str) -> str | None:
    """What kind of secret `text` looks like, or None."""
    for kind, shape in _SHAPES:
        if shape.search(text):
            return kind
    return None


def find(data: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Yield (path, kind) for every key or string value in `data` that looks like a secret."""
    if isinstance(data, dict):
        for key, value in data.items():
            kind = secret_kind(str(key))
            if kind:
                yield path + (key,), kind
            yield from find(value, path + (key,))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from find(item, path + (index,))
    elif isinstance(data, str):
        kind = secret_kind(data)
        if kind:
            yield path, kind
