"""Shared fixtures and hooks: a tiny demo dataset, one training thread, an oracle model, and the GPU skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from medseg.inference import model as model_module
from tests.helpers.checkpoints import OracleNet


@pytest.fixture(scope="session")
def tiny_demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo dataset (8 cases of 32x32x16), generated once per test session."""
    from medseg.data.demo import generate_demo_dataset

    return generate_demo_dataset(tmp_path_factory.mktemp("demo") / "demo3d", num_cases=8, shape=(32, 32, 16),
                                 progress=False)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Train on one thread: the tiny models gain nothing from more, and on a shared 2-core machine two threads
    that wait for each other made a 90-step run take 50 s instead of 8 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints load as :class:`~tests.helpers.checkpoints.OracleNet`: the one-hot label in, its logits out."""
    monkeypatch.setattr(model_module, "build_model", lambda cfg, cin, cout, patch: OracleNet())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
