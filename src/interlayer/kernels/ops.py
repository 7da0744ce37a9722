"""A kernel's forward and backward as registered ``torch.library`` operators, and the autograd that joins them.

Why registered operators rather than an ``autograd.Function``: ``torch.compile`` keeps an operator whole (no graph
break, no tracing into the launchers; the fake implementations give it the outputs' shapes and strides), and a
backward that is an operator of its own is kept whole in the compiled backward graph too. Registering one takes six
pieces (the operator, its fake, the backward operator, its fake, ``setup_context`` and ``register_autograd``) of
which only three facts are the kernel's own: what the backward reads (:func:`kernel_op`'s ``save``), which output
gradients it takes (``grads``) and which inputs its results are the gradients of (``differentiable``). The rest is
stated here once.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor
from torch._library.custom_ops import CustomOpDef


def _every(*grads: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
    return grads


def _wanted(grad: Tensor, want: bool) -> Optional[Tensor]:
    """An input's gradient, None where autograd wants none (the input was None or needs no gradient)."""
    return grad if want else None


def kernel_op(name: str, *, fake: Callable[..., Any], backward: Callable[..., Any], backward_fake: Callable[..., Any],
              save: Callable[..., tuple], differentiable: Sequence[str],
              grads: Callable[..., tuple] = _every, needs: bool = False) -> Callable[[Callable[..., Any]], CustomOpDef]:
    """Decorate a kernel's forward (typed: the operator's schema is read from its annotations) to register it as
    the operator ``name`` (``"interlayer::op"``) with ``fake``, and ``backward`` as ``name + "_backward"`` with
    ``backward_fake``, joined by autograd:

    * ``save(*inputs, output)`` returns what the backward reads besides the gradients, in the order of
      ``backward``'s parameters after them: tensors, None, lists of tensors (kept through ``save_for_backward``) and
      plain values (kept as they are);
    * ``grads(*output_gradients)`` returns ``backward``'s leading arguments (default: every output's gradient);
    * ``backward`` returns, flat and in order, the gradients of the inputs named in ``differentiable`` (a list input
      takes as many as it holds); every other input, and one that needs none (None, or no ``requires_grad``),
      gets None;
    * ``needs``: ``backward`` takes as its last argument which of ``differentiable`` need a gradient (a list of
      bools), so it can skip the work for the others.
    """
    def register(forward: Callable[..., Any]) -> CustomOpDef:
        op = torch.library.custom_op(name, forward, mutates_args=())
        op.register_fake(fake)
        backward_op = torch.library.custom_op(f"{name}_backward", backward, mutates_args=())
        backward_op.register_fake(backward_fake)
        parameters = list(inspect.signature(forward).parameters)
        positions = [parameters.index(n) for n in differentiable]

        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            tensors: list[Optional[Tensor]] = []
            layout: list[tuple[str, Any]] = []  # per saved argument: ("tensor", None), ("list", length), ("value", it)
            for value in save(*inputs, output):
                if value is None or isinstance(value, Tensor):
                    tensors.append(value)
                    layout.append(("tensor", None))
                elif isinstance(value, list) and value and all(isinstance(t, Tensor) for t in value):
                    tensors.extend(value)
                    layout.append(("list", len(value)))
                else:
                    layout.append(("value", value))
            ctx.save_for_backward(*tensors)
            ctx.layout = layout

        def gradients(ctx: Any, *output_grads: Any) -> tuple[Any, ...]:
            saved, arguments = iter(ctx.saved_tensors), []
            for kind, value in ctx.layout:
                if kind == "tensor":
                    arguments.append(next(saved))
                elif kind == "list":
                    arguments.append([next(saved) for _ in range(value)])
                else:
                    arguments.append(value)
            wanted = [ctx.needs_input_grad[i] for i in positions]  # a list of bools for a list input
            if needs:
                arguments.append([any(w) if isinstance(w, (list, tuple)) else bool(w) for w in wanted])
            flat, result = iter(backward_op(*grads(*output_grads), *arguments)), [None] * len(parameters)
            for i, want in zip(positions, wanted):
                result[i] = [_wanted(next(flat), w) for w in want] if isinstance(want, (list, tuple)) else \
                    _wanted(next(flat), want)
            return tuple(result)

        op.register_autograd(gradients, setup_context=setup_context)
        return op

    return register
