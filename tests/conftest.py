"""Shared test set-up: GPU-only tests skip themselves on a CPU build."""

from __future__ import annotations

import pytest
import torch

import tilebook


def pytest_collection_modifyitems(config, items):
    if tilebook.is_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; tilebook is in CPU (interpreter) mode")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    return tilebook.device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site, built once in CPU mode: (html directory, build log)."""
    from site_build import build_site

    return build_site(tmp_path_factory.mktemp("site"))
