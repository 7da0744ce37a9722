"""Reading data files (plain or gzip) with errors that name the file and line, and the bundled data sets; every
tokenizer is in :mod:`interlayer.data.tokenizers`."""
