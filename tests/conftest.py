"""Shared test settings: deterministic seeds and small thread counts so tests behave alike on 2-core CI."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
