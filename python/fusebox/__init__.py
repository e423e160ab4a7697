"""fusebox from Python: load a model, partition it into fused functions, run it.

>>> import fusebox, numpy as np
>>> m = fusebox.load("examples/small_cnn.relax")
>>> part, report = fusebox.partition(m, config="configs/cpu.toml")
>>> outs = fusebox.run(m, seed=0, config="configs/cpu.toml", check=True)
>>> sorted(outs)
['logits', 'prob']

The functions call the library the ``fusebox`` command line is built on, so a model reads,
partitions, runs and fails the same from here as from the command line. Errors are
:class:`fusebox.Error` subclasses with the command line's message. The GIL is released while
fusebox works, so Python threads run (and other fusebox calls) meanwhile.
"""

from ._errors import (
    CheckError,
    ConfigError,
    Error,
    ModelImportError,
    ParseError,
    PartitionError,
    PluginError,
    RunError,
)
from ._fusebox import (
    Module,
    Report,
    Session,
    __version__,
    backends,
    explain,
    load,
    partition,
    run,
)

__all__ = [
    "CheckError",
    "ConfigError",
    "Error",
    "ModelImportError",
    "Module",
    "ParseError",
    "PartitionError",
    "PluginError",
    "Report",
    "Session",
    "RunError",
    "__version__",
    "backends",
    "explain",
    "load",
    "partition",
    "run",
]
