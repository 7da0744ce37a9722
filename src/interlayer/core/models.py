"""Complete models: an encoder-decoder for sequence-to-sequence tasks and an encoder with a classification head.

Both expose ``aux_loss_fns``: named functions of the model that return a scalar to add to the task loss
(a regulariser such as Crossformer-SG). They are evaluated in ``forward`` and returned in ``aux_losses``, unweighted
by the model and each logged under its own name, so the training loop decides nothing about them but the sum.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from torch import Tensor, nn

from .components import Components
from .config import TransformerConfig
from .decoder import Decoder, DecoderCache, DecoderOutput
from .embedding import make_token_embedding
from .encoder import Encoder, EncoderOutput
from .hub import PretrainedMixin, track_ties
from .losses import labels_loss
from .outputs import HFOutputMixin, attentions, hidden_states, one_of, padding_from

AuxLossFn = Callable[[nn.Module], Tensor]


@dataclass
class Seq2SeqOutput(HFOutputMixin):
    """``last_hidden_state`` is the encoder's (HF's ``encoder_last_hidden_state``); ``hidden_states`` and
    ``attentions``, when asked for, the encoder's too (the decoder's are in ``decoder``)."""

    logits: Tensor  # (B, T, V) from the encoder's main output
    encoder: EncoderOutput
    decoder: DecoderOutput
    exit_logits: Optional[list[Tensor]] = None  # one per encoder exit when the encoder has several
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    loss: Optional[Tensor] = None  # with ``labels``: the target tokens' loss (-100 ignored) + exits + aux (training)
    hidden_states: Optional[tuple[Tensor, ...]] = None
    attentions: Optional[tuple[Tensor, ...]] = None


@dataclass
class ClassifierOutput(HFOutputMixin):
    """What a classifier returns: class logits, the encoder's output, the pooled vector, per-exit logits (multi-exit
    training) and auxiliary losses, and the Hugging Face extras asked for by keyword (``loss`` with ``labels``, hidden
    states, attentions)."""

    logits: Tensor  # (B, num_classes)
    encoder: EncoderOutput
    pooled: Tensor  # (B, d)
    exit_logits: Optional[list[Tensor]] = None
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    loss: Optional[Tensor] = None  # with ``labels``: cross-entropy (-100 ignored) + exits + aux losses (training)
    hidden_states: Optional[tuple[Tensor, ...]] = None
    attentions: Optional[tuple[Tensor, ...]] = None

    @property
    def pooler_output(self) -> Tensor:
        """HF's name of ``pooled``: the pooled sentence vector (after the pooler, when the model has one)."""
        return self.pooled

    def with_hf_extras(self, labels: Optional[Tensor], output_hidden_states: bool, output_attentions: bool,
                       training: bool) -> "ClassifierOutput":
        """Fill the fields HF users ask for by keyword (shared by the text and image classifiers); the loss holds
        the aux losses in ``training`` mode only (:func:`~interlayer.core.losses.labels_loss`)."""
        if output_hidden_states:
            self.hidden_states = hidden_states(self.encoder)
        if output_attentions:
            self.attentions = attentions(self.encoder)
        if labels is not None:
            self.loss = labels_loss(self, labels, training=training)[0]
        return self


def _make_encoder(cfg: TransformerConfig, components: Components, tokens: Optional[nn.Embedding]) -> Encoder:
    encoder_class = components.encoder_class or Encoder
    return encoder_class(cfg, components, tokens)


class _AuxLossMixin:
    aux_loss_fns: dict[str, AuxLossFn]

    def compute_aux_losses(self) -> dict[str, Tensor]:
        return {name: fn(self) for name, fn in self.aux_loss_fns.items()}


class EncoderDecoderModel(nn.Module, _AuxLossMixin, PretrainedMixin):
    """The sequence-to-sequence Transformer (``arch="encoder_decoder"``, Vaswani et al. 2017): an
    :class:`~interlayer.core.encoder.Encoder` (or the class a method installs) and a
    :class:`~interlayer.core.decoder.Decoder`, their token tables shared with ``share_embeddings``. :meth:`encode` and
    :meth:`decode` are the two halves translation's beam search drives; ``forward`` runs both with the methods'
    auxiliary losses."""

    def __init__(self, cfg: TransformerConfig, components: Components) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        src_tokens = make_token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        tgt_tokens = src_tokens if cfg.share_embeddings else make_token_embedding(cfg.target_vocab, cfg.d_model,
                                                                                  cfg.pad_id)
        self.encoder = _make_encoder(cfg, components, src_tokens)
        self.decoder = Decoder(cfg, components, tgt_tokens)
        self.aux_loss_fns: dict[str, AuxLossFn] = {}
        track_ties(self)  # each tied tensor once in state dicts

    def encode(self, src_tokens: Tensor, *, need_intermediates: bool = False,
               key_padding_mask: Optional[Tensor] = None, padded: bool = True) -> EncoderOutput:
        """``padded=False``: the source has no padding, so no mask is built (:meth:`Encoder.forward`)."""
        return self.encoder(src_tokens, key_padding_mask=key_padding_mask, need_intermediates=need_intermediates,
                            padded=padded)

    def decode(self, tgt_tokens: Tensor, encoder_out: EncoderOutput, *, cache: Optional[DecoderCache] = None,
               memory: Optional[Tensor] = None, need_intermediates: bool = False) -> DecoderOutput:
        memory = encoder_out.hidden if memory is None else memory
        return self.decoder(tgt_tokens, memory, encoder_out.padding_mask, cache=cache,
                            need_intermediates=need_intermediates)

    def forward(self, src_tokens: Optional[Tensor] = None, tgt_tokens: Optional[Tensor] = None, *,
                input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                decoder_input_ids: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_intermediates: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, use_cache: Optional[bool] = None,
                return_dict: Optional[bool] = None, source_padded: bool = True
                ) -> Union[Seq2SeqOutput, tuple[Tensor, ...]]:
        """Teacher-forced forward: ``tgt_tokens`` (HF: ``decoder_input_ids``) is the target shifted right
        (starting with BOS); ``src_tokens`` is HF's ``input_ids``, ``attention_mask`` (1 where a token is read)
        replaces the source padding found from the pad id; ``source_padded=False`` says there is none (no mask:
        the encoder and cross-attention may take the flash kernel; the translation task passes it for each batch
        it built without padding). ``labels`` (the target, -100 where no loss is wanted)
        give ``output.loss``; unlike transformers, the decoder input is not derived from them (the model does not
        know the translation task's BOS id), so ``decoder_input_ids`` must come too. ``return_dict=False`` returns
        the output's tuple; ``use_cache`` changes nothing (the decoder's cache is the ``DecoderCache`` that decoding
        passes to :meth:`decode`)."""
        src_tokens = one_of(src_tokens, input_ids, "src_tokens", "input_ids")
        if tgt_tokens is None and decoder_input_ids is None:
            raise TypeError("missing the decoder input: pass tgt_tokens or decoder_input_ids (the target shifted "
                            "right, starting with BOS), also when labels are given")
        tgt_tokens = one_of(tgt_tokens, decoder_input_ids, "tgt_tokens", "decoder_input_ids")
        need_intermediates = need_intermediates or output_attentions
        enc = self.encode(src_tokens, need_intermediates=need_intermediates,
                          key_padding_mask=padding_from(attention_mask, None), padded=source_padded)
        dec = self.decode(tgt_tokens, enc, need_intermediates=need_intermediates)
        exit_logits = None
        if enc.exits is not None:
            exit_logits = [dec.logits if e is enc.hidden else self.decode(tgt_tokens, enc, memory=e).logits
                           for e in enc.exits]
        out = Seq2SeqOutput(logits=dec.logits, encoder=enc, decoder=dec, exit_logits=exit_logits,
                            aux_losses=self.compute_aux_losses(),
                            hidden_states=hidden_states(enc) if output_hidden_states else None,
                            attentions=attentions(enc) if output_attentions else None)
        if labels is not None:
            out.loss = labels_loss(out, labels, training=self.training)[0]
        return out.to_tuple() if return_dict is False else out

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed.tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder.output_projection

    def madds(self, src_len: int, tgt_len: Optional[int] = None) -> int:
        tgt_len = src_len if tgt_len is None else tgt_len
        return self.encoder.madds(src_len) + self.decoder.madds(tgt_len, src_len)


class EncoderClassifier(nn.Module, _AuxLossMixin, PretrainedMixin):
    """Encoder + pooling (the first token, or the mean over non-padding tokens) + a linear head."""

    def __init__(self, cfg: TransformerConfig, components: Components, *, with_tokens: bool = True) -> None:
        super().__init__()
        tokens = make_token_embedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id) if with_tokens else None
        self.encoder = _make_encoder(cfg, components, tokens)
        self.pooling = cfg.pooling
        self.pooler = (nn.Sequential(nn.Linear(cfg.d_model, cfg.classifier_hidden), nn.Tanh())
                       if cfg.classifier_hidden else None)
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.classifier_hidden or cfg.d_model, cfg.num_classes)
        self.aux_loss_fns: dict[str, AuxLossFn] = {}
        track_ties(self)  # each tied tensor once in state dicts

    def pool(self, hidden: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """The sentence vector: the first token's state (``pooling="cls"``) or the mean over the real tokens, through
        the pooler (a tanh layer) when the model has one."""
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif padding_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            keep = (~padding_mask).unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.pooler(pooled) if self.pooler is not None else pooled

    def classify(self, hidden: Tensor, padding_mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        pooled = self.pool(hidden, padding_mask)
        return self.head(self.dropout(pooled)), pooled

    def forward(self, tokens: Optional[Tensor] = None, *, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, token_type_ids: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, inputs_embeds: Optional[Tensor] = None,
                segments: Optional[Tensor] = None, key_padding_mask: Optional[Tensor] = None,
                need_intermediates: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, return_dict: Optional[bool] = None
                ) -> Union[ClassifierOutput, tuple[Tensor, ...]]:
        """``tokens`` or HF's ``input_ids`` (or ``inputs_embeds``); ``attention_mask`` (1 where a token is read)
        or ``key_padding_mask`` (True at padding; default: the pad id's positions); ``token_type_ids`` or
        ``segments``; ``labels`` (B,) class ids give ``output.loss`` as the classification tasks compute it;
        ``return_dict=False`` returns the output's tuple."""
        if tokens is None and input_ids is not None:
            tokens = input_ids
        elif input_ids is not None:
            raise TypeError("got both tokens and input_ids; they name the same input, pass one")
        if token_type_ids is not None:
            segments = one_of(segments, token_type_ids, "segments", "token_type_ids")
        need_intermediates = need_intermediates or output_attentions
        enc = self.encoder(tokens, key_padding_mask=padding_from(attention_mask, key_padding_mask),
                           inputs_embeds=inputs_embeds, segments=segments, need_intermediates=need_intermediates)
        logits, pooled = self.classify(enc.hidden, enc.padding_mask)
        exit_logits = None
        if enc.exits is not None:
            exit_logits = [logits if e is enc.hidden else self.classify(e, enc.padding_mask)[0] for e in enc.exits]
        out = ClassifierOutput(logits=logits, encoder=enc, pooled=pooled, exit_logits=exit_logits,
                               aux_losses=self.compute_aux_losses())
        out = out.with_hf_extras(labels, output_hidden_states, output_attentions, self.training)
        return out.to_tuple() if return_dict is False else out

    def get_input_embeddings(self) -> Optional[nn.Embedding]:
        return self.encoder.embed.tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed.tokens = value

    def madds(self, src_len: int, tgt_len: Optional[int] = None) -> int:
        pooler = self.pooler[0].in_features * self.pooler[0].out_features if self.pooler is not None else 0
        return self.encoder.madds(src_len) + pooler + self.head.in_features * self.head.out_features
