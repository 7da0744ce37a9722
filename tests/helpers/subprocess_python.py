"""Running Python code in a fresh interpreter, with the checkout's sources importable or not at all."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from . import SRC

# Prepended to a child's code: interlayer made unimportable (the editable install's path entries and finders
# removed), as for someone who has transformers but not interlayer.
WITHOUT_INTERLAYER = """
import importlib.util, sys
sys.path = [p for p in sys.path if not p.startswith(%r)]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()
                 and "editable" not in type(f).__module__.lower()]
sys.path_hooks = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path_importer_cache.clear()
assert importlib.util.find_spec("interlayer") is None, "interlayer is still importable"
""" % str(SRC)


def run_python(code: str, *, with_interlayer: bool = True, timeout: int = 300) -> str:
    """Run ``code`` in a new interpreter (this one's executable); returns its stdout, raising with its stderr on
    failure. Without ``with_interlayer`` interlayer cannot be imported there."""
    source = textwrap.dedent(code)
    env = dict(os.environ)
    if with_interlayer:
        env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    else:
        source = WITHOUT_INTERLAYER + source
        env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env,
                            timeout=timeout)
    if result.returncode:
        raise AssertionError(f"child failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout
