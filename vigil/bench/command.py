"""The exact command that reproduces a benchmark's result, written into its JSON.

A benchmark's ``run()`` knows the arguments it ran with; the ``vigil bench``
command exposes some of them as options. When every other argument has its
default, the ``vigil bench ...`` line with every option spelled out (defaults
included, so a later change of a default does not change what the line
means) reproduces the run. Otherwise no command line can, and the Python call
with every argument is written instead: a figure from a test's tiny instance
never passes for the CLI's.
"""

from __future__ import annotations

import inspect
import shlex
from typing import Any, Callable, Mapping

__all__ = ["reproducing_command"]

#: Arguments that do not change what is measured.
_IGNORED = frozenset({"progress"})


def reproducing_command(run: Callable[..., Any], arguments: Mapping[str, Any], cli: str,
                        options: Mapping[str, str]) -> str:
    """The command that reproduces ``run(**arguments)``.

    Parameters
    ----------
    run : callable
        The benchmark's ``run``; its signature gives the defaults.
    arguments : mapping
        Every argument ``run`` was called with, by name (``json_path`` included).
    cli : str
        The command, e.g. ``"vigil bench planners"``.
    options : mapping
        ``run`` parameter -> its CLI option: ``"--repeats"``, or ``"--scale/--no-scale"`` for a flag.
        ``json_path`` is always ``--json``. A sequence is written comma-separated
        (``--seeds 2,3``; ``''`` when empty), or once per element when its
        option ends with ``...`` (``"--only..."`` gives ``--only a --only b``).

    Examples
    --------
    >>> def run(json_path=None, *, repeats=7, scale=True, sizes=(1, 2), progress=None): ...
    >>> opts = {"repeats": "--repeats", "scale": "--scale/--no-scale"}
    >>> reproducing_command(run, {"json_path": "out/r.json", "repeats": 3, "scale": False, "sizes": (1, 2),
    ...                           "progress": print}, "vigil bench x", opts)
    'vigil bench x --json out/r.json --repeats 3 --no-scale'
    >>> print(reproducing_command(run, {"json_path": "r.json", "repeats": 3, "sizes": [4]}, "vigil bench x", opts))
    python -c 'from ... import run; run(json_path='"'"'r.json'"'"', repeats=3, sizes=[4])'
    >>> reproducing_command(run, {"sizes": (1, 2, 3)}, "vigil bench x", {"sizes": "--sizes"})
    'vigil bench x --sizes 1,2,3'
    >>> reproducing_command(run, {"sizes": ("a b", "c")}, "vigil bench x", {"sizes": "--only..."})
    "vigil bench x --only 'a b' --only c"
    """
    params = inspect.signature(run).parameters
    unknown = set(arguments) - set(params)
    if unknown:
        raise ValueError(f"arguments {sorted(unknown)} are not parameters of {run.__qualname__}")
    off_cli = [name for name, value in arguments.items()
               if name not in options and name != "json_path" and name not in _IGNORED
               and not _same(value, params[name].default)]
    if off_cli:
        call = ", ".join(f"{name}={value!r}" for name, value in arguments.items() if name not in _IGNORED)
        return "python -c " + shlex.quote(f"from {run.__module__} import {run.__name__}; {run.__name__}({call})")
    parts = [cli]
    if arguments.get("json_path") is not None:
        parts += ["--json", shlex.quote(str(arguments["json_path"]))]
    for name, option in options.items():
        value = arguments.get(name, params[name].default)
        if isinstance(value, bool):
            on, _, off = option.partition("/")
            if not off:
                raise ValueError(f"{name} is a flag: give its option as '--x/--no-x', got {option!r}")
            parts.append(on if value else off)
        elif isinstance(value, (list, tuple)):
            if option.endswith("..."):
                for item in value:
                    parts += [option[:-3], shlex.quote(str(item))]
            else:
                parts += [option, shlex.quote(",".join(str(item) for item in value))]
        elif value is not None:
            parts += [option, shlex.quote(str(value))]
    return " ".join(parts)


def _same(value: Any, default: Any) -> bool:
    """Equal as the run sees it: a tuple default and the same values in a list are the same argument."""
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return len(value) == len(default) and all(_same(a, b) for a, b in zip(value, default))
    return bool(value == default)
