#!/usr/bin/env python3
"""weightbroker.compile from a source checkout: the same as
`python3 -m weightbroker.compile` (python/weightbroker/compile, installed by
`pip install ./python`), which is where its code and documentation live.

  examples/wb_compile.py hf CHECKPOINT_DIR OUT.pt2 [options]

`from wb_compile import compile_package` keeps working for scripts that put
examples/ on their path."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from weightbroker.compile import *  # noqa: E402,F401,F403
from weightbroker.compile import __getattr__  # noqa: E402,F401  (LogitsOnly, on first use)
from weightbroker.compile.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
