"""Triton's interpreter for every test on a machine without a GPU.

Triton decides between interpreter and compiler when a function is decorated: its own
standard library (tl.sum, tl.max, ...) when `triton` is first imported, our kernels when
kernels/triton_*.py are. Test modules import peft, transformers or xgrammar at collection,
and any of them may import triton, so TRITON_INTERPRET is set here, before any test module
is collected. setdefault keeps an explicit choice (TRITON_INTERPRET=0 on a GPU machine runs
the kernel tests compiled; scripts/gpu_session.sh sets it).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
