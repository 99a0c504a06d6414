"""Fixtures of the DFlash tests (helpers live in dflash_tiny.py)."""
from __future__ import annotations

import pytest

from dflash_tiny import random_dflash, tiny_target


@pytest.fixture(scope="session")
def target():
    return tiny_target()


@pytest.fixture(scope="session")
def draft():
    return random_dflash()
