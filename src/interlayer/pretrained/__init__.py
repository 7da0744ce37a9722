"""Hugging Face checkpoints on the core: import (:func:`~interlayer.pretrained.hf.from_hf`, also
``interlayer.from_hf``; its steps :mod:`.hf_checkpoint`, :mod:`.hf_core_config`, :mod:`.hf_load`), export
(:func:`~interlayer.pretrained.export.to_hf`, also ``interlayer.to_hf``), fine-tuning recipes (:mod:`.finetune`), and
interlayer's models as ``transformers`` classes (:mod:`.transformers_classes`). The checkpoints' tokenizers are
:mod:`interlayer.data.tokenizers`'.

Families: BERT, ELECTRA, RoBERTa/XLM-R, DistilBERT, ViT and GPT-2 (:mod:`.families`).
``from_hf(directory, extra_sections={"predictive": pa_bert_section()})`` builds PA-BERT from a released checkpoint
as the PA paper does (Sec. 4.1.2, Table 2, App. B.2.2); :func:`~interlayer.pretrained.bert.import_bert` is the text
import returning ``(model, tokenizer)``. Each name is imported from the module that defines it; this package holds
no code of its own.
"""
