"""``python -m interlayer.cli`` (and ``torchrun ... -m interlayer.cli``): the ``interlayer`` command."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
