"""The exceptions fusebox raises: every one is a `fusebox.Error`.

The message (``str(e)``) is the text the ``fusebox`` command line prints after ``error:``; a
positioned error (a parse error in a module, a config or a pattern table) also has ``file``,
``line`` and ``col`` (1-based), which are ``None`` otherwise.
"""

from typing import Optional

__all__ = [
    "Error",
    "ParseError",
    "ModelImportError",
    "ConfigError",
    "PluginError",
    "PartitionError",
    "RunError",
    "CheckError",
]


class Error(Exception):
    """Any error fusebox reports (also: a bug caught at the boundary, which says so)."""

    def __init__(
        self,
        message: str,
        file: Optional[str] = None,
        line: Optional[int] = None,
        col: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.col = col

    def __str__(self) -> str:
        return self.message


class ParseError(Error):
    """A module in the text format could not be read: a syntax or type error, with its
    position, or a file that cannot be read."""


class ModelImportError(Error):
    """An ONNX model could not be imported (not a model, an unsupported node, bad data)."""


class ConfigError(Error):
    """A config or a pattern table (file, dict or list) is not valid, names an unknown
    backend, or an option has a bad value."""


class PluginError(Error):
    """A backend plugin library could not be loaded or misbehaved."""


class PartitionError(Error):
    """Partitioning, claiming or compiling failed (for example ``strict = true`` with work no
    backend claimed), or ``explain`` was asked about a binding ``main`` does not have."""


class RunError(Error):
    """The inputs do not fit ``main`` (missing, unknown, wrong dtype or shape), or the run
    failed (an op's error, the memory limit)."""


class CheckError(RunError):
    """``check=True``: an output differs from the unpartitioned module's."""
