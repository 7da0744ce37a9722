"""The old import path of :mod:`interlayer.tasks.translation_decoding` (greedy and beam-search decoding of the
translation task), kept so that code importing ``interlayer.decoding`` keeps working."""
from .tasks.translation_decoding import DecodeOptions, beam_search, decode, greedy_decode

__all__ = ["DecodeOptions", "beam_search", "decode", "greedy_decode"]
