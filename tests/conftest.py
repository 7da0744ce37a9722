"""Shared test settings and fixtures: deterministic seeds, and the tiny corpus several modules train on.

Plain functions and constants that several modules share are in ``tests/helpers``; no test module imports
another (``tests/test_test_layout.py``)."""
import os
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run under Triton's interpreter, in the tests that ask for them
# (``kernel_mode("triton")``); set before any kernel module is imported, since ``triton.jit`` reads it then.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist (make test: one worker a core) each worker computes with one thread: two workers of two threads
# each on two cores spend their time waiting for each other
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from helpers.translation import SHORT_LEXICON, write_corpus


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``make test``'s xdist groups whole. Under ``--dist loadgroup`` pytest-xdist (3.8) suffixes the node id of
    an ``xdist_group``'s tests with the group by writing ``item._nodeid``; pytest 9 reads the id from ``item._id``,
    so the suffix was lost, the groups were split over both workers, and the expensive runs they share (the GPU
    campaign's dry runs, the kernels' audits) ran on both: 70 s twice in one suite. The suffix goes where this pytest
    reads it (tests/test_gpu_campaign.py checks that it arrives)."""
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import NodeId  # pytest 9; before it, xdist's own suffix works
    except ImportError:
        return
    for item in items:
        suffixed = getattr(item, "_nodeid", None)
        if suffixed and suffixed != item.nodeid:
            item._id = NodeId.parse(suffixed)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny De-En corpus of the comparison and reliability tests: 120/6/6 lowercase pairs of 2-5 words, plain
    text. A module that needs a bigger corpus overrides this fixture with its own ``write_corpus`` sizes."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), {"train": (120, 1), "valid": (6, 2), "test": (6, 3)},
                        lexicon=SHORT_LEXICON, lengths=(2, 5), sentences=False)


@pytest.fixture()
def real_builds(monkeypatch):
    """The devices of every Linear layer built from here on: a model built for real has 'cpu' among them."""
    devices, reset = [], torch.nn.Linear.reset_parameters
    monkeypatch.setattr(torch.nn.Linear, "reset_parameters",
                        lambda self: devices.append(self.weight.device.type) or reset(self))
    return devices
