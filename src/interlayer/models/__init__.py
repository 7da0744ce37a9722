"""Models built on the core for tasks whose inputs are not one token sequence (MCAN: a question and an image)."""
