"""The one rule between a Triton kernel and its reference path (src/interlayer/kernels/dispatch.py)."""
import pytest
import torch

from interlayer.kernels import dispatch
from interlayer.kernels.dispatch import kernel_mode, use_triton


def test_auto_keeps_cpu_tensors_on_the_reference_even_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with kernel_mode("auto"):
        assert not use_triton(torch.zeros(2))
    with kernel_mode("triton"):
        assert use_triton(torch.zeros(2)) == dispatch.triton_available()


def test_reference_mode_never_runs_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with kernel_mode("reference"):
        assert not use_triton(torch.zeros(2))


def test_triton_mode_refuses_to_fall_back_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with kernel_mode("triton"), pytest.raises(RuntimeError, match="not CUDA"):
        use_triton(torch.zeros(2), kernel="test")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with kernel_mode("triton"), pytest.raises(RuntimeError, match="does not cover this case"):
        use_triton(torch.zeros(2), covered=False, kernel="test")
    with kernel_mode("auto"):  # auto falls back quietly
        assert not use_triton(torch.zeros(2), covered=False)


def test_without_triton_every_mode_but_triton_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with kernel_mode("auto"):
        assert not use_triton(torch.zeros(2))
    with kernel_mode("triton"), pytest.raises(RuntimeError, match="not installed"):
        use_triton(torch.zeros(2))


def test_the_mode_comes_from_the_environment_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTERLAYER_KERNELS", "reference")
    assert dispatch.current_mode() == "reference"
    with kernel_mode("triton"):
        assert dispatch.current_mode() == "triton"
    assert dispatch.current_mode() == "reference"
    monkeypatch.setenv("INTERLAYER_KERNELS", "fast")
    with pytest.raises(ValueError, match="INTERLAYER_KERNELS='fast'.*auto, triton, reference"):
        dispatch.current_mode()
    with pytest.raises(ValueError, match="kernel mode"):
        with kernel_mode("fast"):  # type: ignore[arg-type]
            pass


def test_auto_runs_only_the_kernels_a_gpu_run_has_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unmeasured kernel is opt-in (``triton``); ``auto`` leaves it to its reference path even where it could run.
    (No tensors: the device test passes, so only the mode and the list decide.)"""
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    monkeypatch.setattr(dispatch, "VALIDATED", frozenset({"cross-entropy"}))
    with kernel_mode("auto"):
        assert use_triton(kernel="cross-entropy")
        assert not use_triton(kernel="predictive-attention")
    with kernel_mode("triton"):
        assert use_triton(kernel="predictive-attention")
    with kernel_mode("reference"):
        assert not use_triton(kernel="cross-entropy")


def test_the_validated_kernels_are_kernels_that_exist() -> None:
    """A name in VALIDATED that no kernel asks for (a typo, a renamed kernel) would leave that kernel opt-in while the
    docs say users get it; Predictive Attention's joins only after its compiled step has run on a GPU."""
    import re
    from pathlib import Path

    names = set()
    for path in Path(dispatch.__file__).parent.glob("*.py"):
        names |= set(re.findall(r'kernel=(?:"([a-z_-]+)"|KERNEL)', path.read_text()))
        names |= set(re.findall(r'^KERNEL = "([a-z_-]+)"', path.read_text(), re.M))
    assert dispatch.VALIDATED <= names - {""}, dispatch.VALIDATED - names
    assert "predictive-attention" not in dispatch.VALIDATED
