"""Every tokenizer interlayer reads or writes, in one place; each knows files and texts, no model.

* :mod:`.language_model`: the language-modelling task's (characters, byte-level BPE trained on the corpus, bare
  ids), saved beside a run and read back;
* :mod:`.pretrained`: what every checkpoint tokenizer offers (:class:`~.pretrained.PretrainedTokenizer`) and which
  one a Hugging Face folder needs (:func:`~.pretrained.tokenizer_kind`); the pipelines that give exactly
  ``transformers``' ids: :mod:`.wordpiece` (BERT, ELECTRA, DistilBERT), :mod:`.byte_level_bpe` (RoBERTa, or any
  ``tokenizer.json``) and :mod:`.gpt2` (a GPT-2's byte-level BPE as the language-modelling tokenizer).

The translation task's joint BPE, which the task learns itself, is :mod:`interlayer.data.bpe`. Each name is imported
from the module that defines it; this package holds no code of its own.
"""
