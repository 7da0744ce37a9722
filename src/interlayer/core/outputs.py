"""What Hugging Face users expect of a model's output, shared by every interlayer output class.

``transformers``' ``ModelOutput`` is read three ways, and code written for it (``Trainer`` among it) uses all
three: attributes (``out.loss``, ``out.logits``, ``out.last_hidden_state``), keys (``out["loss"]``) and positions
(``out[0]`` is the loss when labels were given, else the logits; ``out[1:]`` the rest). :class:`HFOutputMixin`
gives the interlayer dataclasses these habits without making ``transformers`` a dependency of the core; the
positional form holds only tensors (``loss``, ``logits``, then ``hidden_states`` and ``attentions`` when asked
for), as ``ModelOutput.to_tuple`` skips what is ``None``.

:func:`hidden_states` and :func:`attentions` turn an :class:`~interlayer.core.encoder.EncoderOutput` into HF's
tuples: the embeddings, each layer's output, the last one after the final LayerNorm (as GPT-2's ``ln_f`` output
is ``hidden_states[-1]``); one ``(B, heads, T, T)`` softmax per layer.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from torch import Tensor

from .encoder import EncoderOutput


class HFOutputMixin:
    """``out["name"]``, ``out[i]``, ``out.to_tuple()`` and ``out.last_hidden_state`` on an output dataclass."""

    loss: Optional[Tensor]
    logits: Tensor
    encoder: EncoderOutput
    hidden_states: Optional[tuple[Tensor, ...]]
    attentions: Optional[tuple[Tensor, ...]]

    @property
    def last_hidden_state(self) -> Tensor:
        """The stack's final states (after the final LayerNorm in pre-LN), HF's ``last_hidden_state``."""
        return self.encoder.hidden

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(value for value in (self.loss, self.logits, self.hidden_states, self.attentions)
                     if value is not None)

    def __getitem__(self, key: Union[str, int, slice]) -> Any:
        if isinstance(key, str):
            if key == "last_hidden_state" or key in type(self).__dataclass_fields__:  # type: ignore[attr-defined]
                return getattr(self, key)
            raise KeyError(f"{type(self).__name__} has no field {key!r}")
        return self.to_tuple()[key]


def hidden_states(enc: EncoderOutput) -> tuple[Tensor, ...]:
    """HF's ``hidden_states``: the embedded input, then each layer's output (the last one normalised)."""
    return (enc.embedded, *enc.states[:-1], enc.hidden)


def attentions(enc: EncoderOutput) -> tuple[Tensor, ...]:
    """HF's ``attentions``: each layer's attention probabilities (the model must have run with intermediates)."""
    return tuple(a.probs for a in enc.attentions if a is not None)


def one_of(ours: Optional[Tensor], theirs: Optional[Tensor], our_name: str, their_name: str) -> Tensor:
    """The input given under interlayer's name or Hugging Face's (``tokens`` or ``input_ids``), never both."""
    if ours is not None and theirs is not None:
        raise TypeError(f"got both {our_name} and {their_name}; they name the same input, pass one")
    if ours is None and theirs is None:
        raise TypeError(f"missing the input: pass {our_name} (or {their_name})")
    return ours if ours is not None else theirs  # type: ignore[return-value]


def padding_from(attention_mask: Optional[Tensor], padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """interlayer's ``padding_mask`` (True at padding) from HF's ``attention_mask`` (1 where a token is read)."""
    if attention_mask is None:
        return padding_mask
    if padding_mask is not None:
        raise TypeError("got both attention_mask and padding_mask; one is the other's negation, pass one")
    return attention_mask == 0
