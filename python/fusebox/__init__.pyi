"""Type stubs of the `fusebox` package (the native module `fusebox._fusebox` and the errors)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

PathLike = Union[str, "os.PathLike[str]"]
#: A config: a TOML file, or the same tables as a dict
#: (``{"target": "cpu", "backend": [{"name": "cpu"}]}``).
ConfigArg = Union[PathLike, Mapping[str, Any]]
#: A pattern table: a TOML file of ``[[pattern]]`` tables, or a list of dicts with ``name``,
#: ``pattern`` and optional ``priority`` and ``check``.
PatternsArg = Union[PathLike, Sequence[Mapping[str, Any]]]

class Error(Exception):
    """Any error fusebox reports; ``str(e)`` is the CLI's message."""

    message: str
    file: Optional[str]
    line: Optional[int]
    col: Optional[int]
    def __init__(
        self,
        message: str,
        file: Optional[str] = ...,
        line: Optional[int] = ...,
        col: Optional[int] = ...,
    ) -> None: ...

class ParseError(Error): ...
class ModelImportError(Error): ...
class ConfigError(Error): ...
class PluginError(Error): ...
class PartitionError(Error): ...
class RunError(Error): ...
class CheckError(RunError): ...

class Module:
    """A module of functions: what `load` reads and `partition` makes. Immutable."""

    @property
    def functions(self) -> List[str]:
        """The names of the module's functions, in module order."""
    @property
    def params(self) -> List[str]:
        """The names of `main`'s parameters (the keys `run` takes), in order."""
    @property
    def source(self) -> Optional[str]:
        """The file the module was read from, if any."""
    def text(self) -> str:
        """The module in the text format (TVMScript)."""
    def save(self, path: PathLike) -> None:
        """Writes the text to `path` and the constants to the `.safetensors` file beside it."""
    def bind(self, dims: Mapping[str, int]) -> "Module":
        """The module with its symbolic dims given values (`{"batch": 1}`), as the CLI's
        `--bind NAME=VALUE`; raises `ModelImportError` for an unknown name or a bad value."""

class Report:
    """What a partition did: the JSON report as Python objects, and `explain`."""

    @property
    def functions(self) -> List[Dict[str, Any]]: ...
    @property
    def rejections(self) -> List[Dict[str, Any]]: ...
    @property
    def main(self) -> List[str]: ...
    @property
    def claims(self) -> List[Dict[str, Any]]: ...
    @property
    def notes(self) -> List[str]: ...
    def json(self) -> str:
        """The report as `fusebox partition --emit json` prints it."""
    def explain(self, binding: str) -> str:
        """What `fusebox explain` prints for `binding` of `main`."""

def load(path: PathLike) -> Module:
    """Reads a model: `.onnx` (or a folder holding one) is imported, anything else parsed as
    text (constants from the `.safetensors` file beside it)."""

def partition(
    module: Module,
    config: Optional[ConfigArg] = None,
    patterns: Optional[PatternsArg] = None,
    bind_constants: Optional[bool] = None,
    annotate_codegen: Optional[bool] = None,
    merge: Optional[bool] = None,
    fuse_ops: Optional[bool] = None,
    fuse_opt_level: Optional[int] = None,
    max_depth: Optional[int] = None,
) -> Tuple[Module, Report]:
    """`fusebox partition`: with a config, its backend flow (a flag given here overrides its
    `[partition]` value); without, the pattern table and the flags."""

def run(
    module: Module,
    inputs: Optional[Mapping[str, npt.ArrayLike]] = None,
    config: Optional[ConfigArg] = None,
    patterns: Optional[PatternsArg] = None,
    check: bool = False,
    seed: Optional[int] = None,
    memory_limit: Optional[Union[int, str]] = None,
) -> Dict[str, np.ndarray]:
    """`fusebox run`: the outputs by name. Every parameter of `main` must be in `inputs`
    unless `seed` fills the rest with the CLI's random values; `check=True` compares with the
    unpartitioned module and raises `CheckError` on a difference."""

class Session:
    """A module prepared once and run many times, as `fusebox run --repeat` runs it:
    partitioned when made (with a config: claimed and compiled), one executor kept, so the
    constants it decoded and the weight forms it made serve every later `run`. The arguments
    are `run`'s; the errors too."""

    def __init__(
        self,
        module: Module,
        config: Optional[ConfigArg] = None,
        patterns: Optional[PatternsArg] = None,
        memory_limit: Optional[Union[int, str]] = None,
    ) -> None: ...
    def run(
        self,
        inputs: Optional[Mapping[str, npt.ArrayLike]] = None,
        seed: Optional[int] = None,
    ) -> Dict[str, np.ndarray]:
        """One inference: the outputs by name, as `fusebox.run` gives them."""
    @property
    def module(self) -> Module:
        """The partitioned module the session runs."""

def backends(config: Optional[ConfigArg] = None) -> Dict[str, Any]:
    """`fusebox backends`: ``{"config", "backends": [{"name", "origin", "patterns"}],
    "unassigned", "lint"}``."""

def explain(module: Module, binding: str, config: Optional[ConfigArg] = None) -> str:
    """`fusebox explain` (default config: configs/cpu.toml)."""
