"""Pretrained Hugging Face BERT-family checkpoints on the core: import, export, and their WordPiece tokenizer.

``import_bert(directory, extra_sections={"predictive": pa_bert_section()})`` builds PA-BERT from a released
checkpoint as the PA paper does (Sec. 4.1.2, Table 2, App. B.2.2); see :mod:`interlayer.pretrained.bert`.
"""
from .bert import (PA_BERT_ALPHA, SUPPORTED_MODEL_TYPES, ImportReport, PretrainedError, export_bert, import_bert,
                   pa_bert_section)
from .wordpiece import EncodedBatch, TokenizerError, WordPieceTokenizer

__all__ = ["EncodedBatch", "ImportReport", "PA_BERT_ALPHA", "PretrainedError", "SUPPORTED_MODEL_TYPES",
           "TokenizerError", "WordPieceTokenizer", "export_bert", "import_bert", "pa_bert_section"]
