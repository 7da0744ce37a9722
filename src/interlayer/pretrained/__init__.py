"""Hugging Face checkpoints on the core: import (:func:`from_hf`), export (:func:`to_hf`), their tokenizers.

Families: BERT, ELECTRA, RoBERTa/XLM-R, DistilBERT and ViT (:mod:`interlayer.pretrained.families`).
``from_hf(directory, extra_sections={"predictive": pa_bert_section()})`` builds PA-BERT from a released checkpoint
as the PA paper does (Sec. 4.1.2, Table 2, App. B.2.2); ``import_bert`` is the text import returning
``(model, tokenizer)``.
"""
from ..errors import PretrainedError, TokenizerError
from .bert import PA_BERT_ALPHA, export_bert, import_bert, pa_bert_section
from .bpe import BPETokenizer
from .export import to_hf
from .families import SUPPORTED_MODEL_TYPES
from .hf import ImportReport, from_hf, load_checkpoint, load_tokenizer
from .tokenization import EncodedBatch, PretrainedTokenizer
from .wordpiece import WordPieceTokenizer

__all__ = ["BPETokenizer", "EncodedBatch", "ImportReport", "PA_BERT_ALPHA", "PretrainedError", "PretrainedTokenizer",
           "SUPPORTED_MODEL_TYPES", "TokenizerError", "WordPieceTokenizer", "export_bert", "from_hf", "import_bert",
           "load_checkpoint", "load_tokenizer", "pa_bert_section", "to_hf"]
