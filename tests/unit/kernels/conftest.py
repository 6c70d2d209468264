"""Kernel tests run Triton on CPU through its interpreter.

Triton picks interpreter or compiler when a kernel is decorated (when our triton_*
modules are imported), reading TRITON_INTERPRET then, so it is set here at conftest
import time, before any test module imports a kernel. setdefault leaves an explicit
choice alone (TRITON_INTERPRET=0 on a GPU machine runs these tests on compiled
kernels and CUDA tensors). torch does not import triton, so import order with torch
does not matter; only an earlier import of our triton_* modules would.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

_ON_GPU = os.environ["TRITON_INTERPRET"] == "0" and torch.cuda.is_available()


@pytest.fixture
def device() -> str:
    return "cuda" if _ON_GPU else "cpu"
