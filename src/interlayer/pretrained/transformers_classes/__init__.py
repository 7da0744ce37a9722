"""interlayer's models as ``transformers`` classes (``model_type: "interlayer"``), whatever their method: the
config class (:mod:`.configuration`), the model classes ``AutoModel*`` load (:mod:`.modeling`), their registration
with ``transformers`` when it is imported (:mod:`.auto`, with the ``Trainer`` callback), and ``export --with-code``,
which copies their code into a model folder (:mod:`.remote_code`). Each name is imported from the module that
defines it; this package holds no code of its own.
"""
