"""Recording what one forward pass of a core model computes, for a loss on activations (Crossformer's soft guidance
on states, ``methods/crossformer.py``): the outputs of named submodules, the query/key/value projections of an
attention (which the fused attention never calls as modules) and the padding masks of the model's stacks, kept only
during ``model(...)``. How each core model passes its padding (the encoder's output, a causal LM's keyword, the
decoder's tokens and memory mask) is the core's knowledge, so it is read here, beside the core.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn


class StateRecorder:
    """The activations of one forward pass of a model, as :func:`record_forward`'s hooks record them.

    ``states[path]`` holds one tensor per call of the site (Multi-Pass runs the encoder layers once per pass; an MPT
    model with per-pass losses decodes once per pass); ``padding`` the padding masks (True at padding) of the
    ``"encoder"`` tokens, the ``"decoder"`` tokens and the decoder's ``"memory"``. Nothing is recorded unless
    ``armed``: between the model's forward pre-hook and its forward hook, so ``encode``/``decode`` calls and
    incremental decoding, which never reach the loss, keep nothing.
    """

    def __init__(self) -> None:
        self.armed = False
        self.states: dict[str, list[Tensor]] = {}
        self.padding: dict[str, Optional[Tensor]] = {}

    def start(self) -> None:
        self.states, self.padding, self.armed = {}, {}, True

    def stop(self) -> None:
        self.states, self.padding, self.armed = {}, {}, False

    def add(self, path: str, state: Tensor) -> None:
        if self.armed:
            self.states.setdefault(path, []).append(state)


class _Start:
    """Forward pre-hook of the model: a new forward pass, a new record."""

    def __init__(self, recorder: StateRecorder) -> None:
        self.recorder = recorder

    def __call__(self, module: nn.Module, args: tuple) -> None:
        self.recorder.start()


class _Stop:
    """Forward hook of the model (also called when the forward raises): the record is dropped."""

    def __init__(self, recorder: StateRecorder) -> None:
        self.recorder = recorder

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.recorder.stop()


class _LinearOutput:
    """Forward hook of a recorded submodule (a guided ``out_proj``/``fc1``/``fc2``): its output is the state, as the
    forward computed it."""

    def __init__(self, recorder: StateRecorder, path: str) -> None:
        self.recorder, self.path = recorder, path

    def __call__(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.recorder.add(self.path, output)


class _Projections:
    """Forward hook of a recorded attention: ``q_proj``/``k_proj``/``v_proj`` applied to the input it was given
    (``x``; ``memory`` for the keys and values of cross-attention). ``names`` pairs each projection with whether
    its state needs a gradient (a guided, lower state); one that does not (a guide, whose gradient is stopped) is
    computed without a graph."""

    def __init__(self, recorder: StateRecorder, path: str, names: tuple[tuple[str, bool], ...]) -> None:
        self.recorder, self.path, self.names = recorder, path, names

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        if not self.recorder.armed:
            return
        x = args[0] if args else kwargs["x"]
        memory = args[1] if len(args) > 1 else kwargs.get("memory")
        for name, guided in self.names:
            source = x if name == "q_proj" or memory is None else memory
            with torch.set_grad_enabled(guided and torch.is_grad_enabled()):
                self.recorder.add(f"{self.path}.{name}", getattr(module, name)(source))


class _EncoderPadding:
    """Forward hook of the encoder: the padding mask its layers used (``EncoderOutput.padding_mask``)."""

    def __init__(self, recorder: StateRecorder) -> None:
        self.recorder = recorder

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.recorder.armed:
            self.recorder.padding["encoder"] = output.padding_mask


class _CausalLMPadding:
    """Forward pre-hook of a causal language model: its ``padding_mask`` keyword (True at padding) is the mask of
    the encoder stack it runs. The model calls ``encoder.process`` / ``run_layers`` itself, never the encoder's
    ``forward``, so :class:`_EncoderPadding` would record nothing and padded positions would count."""

    def __init__(self, recorder: StateRecorder) -> None:
        self.recorder = recorder

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        mask = kwargs.get("padding_mask")
        if self.recorder.armed and mask is not None:  # with a cache the mask also covers the cached positions
            tokens = args[0] if args else kwargs["tokens"]
            self.recorder.padding["encoder"] = mask[:, -tokens.shape[1]:]


class _DecoderPadding:
    """Forward pre-hook of the decoder: the padded target positions (the decoder itself needs no mask: with right
    padding the causal mask hides them) and the memory's padding mask."""

    def __init__(self, recorder: StateRecorder, pad_id: int) -> None:
        self.recorder, self.pad_id = recorder, pad_id

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if self.recorder.armed:
            tokens = args[0] if args else kwargs["tokens"]
            self.recorder.padding["decoder"] = tokens.eq(self.pad_id)
            self.recorder.padding["memory"] = args[2] if len(args) > 2 else kwargs.get("memory_padding_mask")


def record_forward(recorder: StateRecorder, model: nn.Module, outputs: list[str],
                   projections: dict[str, tuple[tuple[str, bool], ...]], *, causal_lm: bool, pad_id: int) -> None:
    """Register on ``model`` the hooks that fill ``recorder`` during each ``model(...)``: the output of each
    submodule of ``outputs`` (by path), the projections ``projections[path]`` names of each attention at ``path``
    (each with whether its state needs a gradient), and the padding masks of its stacks (``causal_lm``: the
    model's own ``padding_mask`` keyword; the decoder's padded tokens are those equal to ``pad_id``)."""
    for path in outputs:
        model.get_submodule(path).register_forward_hook(_LinearOutput(recorder, path))
    for block, names in projections.items():
        model.get_submodule(block).register_forward_hook(_Projections(recorder, block, names), with_kwargs=True)
    if causal_lm:
        model.register_forward_pre_hook(_CausalLMPadding(recorder), with_kwargs=True)
    elif hasattr(model, "encoder"):
        model.encoder.register_forward_hook(_EncoderPadding(recorder))
    if hasattr(model, "decoder"):
        model.decoder.register_forward_pre_hook(_DecoderPadding(recorder, pad_id), with_kwargs=True)
    model.register_forward_pre_hook(_Start(recorder), prepend=True)  # a new record before the padding is kept
    model.register_forward_hook(_Stop(recorder), always_call=True)
