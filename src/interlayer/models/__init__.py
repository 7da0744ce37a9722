"""The named models: one registry (:mod:`interlayer.models.registry`) and the model families besides the core
Transformer, each in its own module that registers its family and presets when imported.

* :mod:`~interlayer.models.transformer` -- the core Transformer (:mod:`interlayer.core` plus the method sections of
  :class:`~interlayer.config.ModelConfig`) as a family; its presets live in :mod:`interlayer.papers`;
* :mod:`~interlayer.models.cnn_text` -- the CNN text classifier of PA Table 1;
* :mod:`~interlayer.models.vision` -- the ViT and the PA paper's Conv-Transformer for images;
* :mod:`~interlayer.models.gat` -- Graph Attention Networks and their Crossformer adaptation;
* :mod:`~interlayer.models.mcan` -- MCAN for visual question answering (a question and an image), with the LW,
  Crossformer and PA presets of its papers.

Nothing is imported here: the registry imports these modules when it is first asked for a name.
"""
