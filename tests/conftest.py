from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = REPO / "environments"


@pytest.fixture
def environments_dir() -> Path:
    return ENVIRONMENTS
