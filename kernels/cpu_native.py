"""Build and load the C CPU kernels (`cpu_quant.c`) once per source, compiler and CPU.

Why C through ctypes and not a torch extension: the library needs no torch headers, so it
compiles in about a second with the C compiler the server image already carries (Triton
needs it too); torch's own int4 weight-only matmul (`_weight_int4pack_mm_for_cpu`) takes
fp32 activations but runs 10-100x slower than fp32 GEMM on AVX2 CPUs (docs/cpu.md).

The shared object is cached under `$LLMSERVICE_CACHE/kernels` (default
`~/.cache/llmservice/kernels`, else the temp folder) by a hash of the source, the
compiler's version, the flags and the CPU's feature flags (`-march=native`). It links the
same `libgomp.so.1` torch loaded, so its OpenMP loops share torch's thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp.so.1 before our library asks for it)

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cpu_quant.c")
HEADERS = SOURCE.parent  # cpu_math.h: included by the sources, and by older ones the benches build
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
_lock = threading.Lock()
_state: dict[str, object] = {}


class NativeUnavailable(RuntimeError):
    """The C kernels could not be built here (no compiler, compile error)."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler (cc/gcc) on PATH")
    return cc


def cache_dir() -> Path:
    root = os.environ.get("LLMSERVICE_CACHE")
    for base in ([Path(root)] if root else []) + [
        Path.home() / ".cache" / "llmservice",
        Path(tempfile.gettempdir()),
    ]:
        d = base / "kernels"
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise NativeUnavailable("no writable cache folder for the compiled kernels")


def _included_sources(source: Path) -> list[str]:
    """The text of `source` and of the C files it includes (cpu_decoder.c is built from
    the other kernels' sources as one unit): a change to any of them is a new library."""
    text = source.read_text()
    texts = [text]
    for name in re.findall(r'^#include "([^"]+\.c)"', text, flags=re.M):
        texts += _included_sources(source.with_name(name))
    return texts


def build(source: Path = SOURCE) -> Path:
    """Compile `source` into the cache (if not there yet); return the .so path."""
    cc = _compiler()
    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"{cc} --version failed: {e}") from e
    headers = [h.read_text() for h in sorted(HEADERS.glob("*.h"))]  # what the sources include
    key = hashlib.sha256(
        "\0".join([*_included_sources(source), *headers, version, " ".join(FLAGS), _cpu_flags()]).encode()
    ).hexdigest()
    out = cache_dir() / f"{source.stem}-{key[:16]}.so"
    if out.exists():
        return out
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(
        [cc, *FLAGS, f"-I{HEADERS}", str(source), "-o", str(tmp), "-lm"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise NativeUnavailable(f"compiling {source.name} failed: {proc.stderr.strip()[-2000:]}")
    os.replace(tmp, out)  # atomic: a concurrent builder sees the old name or the whole file
    return out


def _declare(lib: ctypes.CDLL, name: str) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    if name == "cpu_quant":
        lib.qk_matmul.argtypes = [i32, p, i64, i64, p, i64, i64, p, i64, p, i32]
        lib.qk_matmul.restype = None
        lib.qk_dequant.argtypes = [i32, p, i64, i64, p, i32]
        lib.qk_dequant.restype = None
        lib.qk_rows.argtypes = [i32, p, i64, p, i64, p]
        lib.qk_rows.restype = None
        lib.qk_block_bytes.argtypes = [i32]
        lib.qk_block_bytes.restype = i32
        lib.qk_has_avx2.argtypes = []
        lib.qk_has_avx2.restype = i32
    elif name == "cpu_ops":
        lib.qo_rms_norm.argtypes = [p, p, i64, i64, f32, p, i32]
        lib.qo_add_rms_norm.argtypes = [p, p, p, i64, i64, f32, p, i32]
        lib.qo_rotary.argtypes = [p, p, i64, i64, p, i64, i64, i64, i64, p, i64, i32]
        lib.qo_rotary.restype = i32
        lib.qo_silu_mul.argtypes = [p, i64, i64, p, i32]
        lib.qo_cache_write.argtypes = [p, i64, p, i64, p, p, p, i64, i64, i64]
        lib.qo_cache_write.restype = i32
        for f in (lib.qo_rms_norm, lib.qo_add_rms_norm, lib.qo_silu_mul):
            f.restype = None
    elif name == "cpu_decoder":
        lib.qd_decode.argtypes = [p, p, p, p, i64, i64, p, p, p, p, p, i64, p, i64, i32, p, p, p, i32]
        lib.qd_decode.restype = i32
        lib.ql_add.argtypes = [p, p, p, i64, i64, p, i64, i32]
        lib.ql_add.restype = i32
        lib.qd_work_floats.argtypes = [p, i64]
        lib.qd_work_floats.restype = i64
    elif name == "cpu_attention":
        lib.qa_decode.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, i64, f32, p, i32]
        lib.qa_decode.restype = i32


def library(name: str = "cpu_quant") -> ctypes.CDLL:
    """The loaded kernels of kernels/<name>.c; raises NativeUnavailable (with the reason)
    if they cannot be built."""
    with _lock:
        if name in _state:
            return _state[name]  # type: ignore[return-value]
        if f"error:{name}" in _state:
            raise NativeUnavailable(str(_state[f"error:{name}"]))
        try:
            lib = ctypes.CDLL(str(build(SOURCE.with_name(f"{name}.c"))))
            _declare(lib, name)
        except (NativeUnavailable, OSError) as e:
            _state[f"error:{name}"] = str(e)
            raise NativeUnavailable(str(e)) from e
        if name == "cpu_quant" and not lib.qk_has_avx2():
            log.warning("CPU kernels built without AVX2/FMA/F16C: the scalar loops are slow")
        _state[name] = lib
        return lib


def error(name: str = "cpu_quant") -> str | None:
    """Why the kernels are unavailable (None if they loaded or were not tried)."""
    return _state.get(f"error:{name}")  # type: ignore[return-value]


def available(name: str = "cpu_quant") -> bool:
    if name in _state:  # loaded: asked by every per-layer op, so no lock on this path
        return True
    try:
        library(name)
    except NativeUnavailable:
        return False
    return True
