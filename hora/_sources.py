"""The lines of code that has no file on the ranks: notebook cells, `exec`'d strings, the REPL.

Python prints a traceback's lines from `linecache`. A function defined in a notebook cell (IPython
and ipykernel register each cell there, under `<ipython-input-3-...>` or
`/tmp/ipykernel_<pid>/<hash>.py`), or from a string that a tool registered before `exec`, has its
lines only in the driver's linecache, and a rank shows `File "<dynamic-code>", line 5` with no
line under it. So the payload carries the lines of every file whose code it ships by value; the
rank registers them before it unpickles the function, and names IPython's cells as IPython does
(`Cell In[3], line 5`).
"""

from __future__ import annotations

import linecache
import re
import sys
from typing import Any

#: filename -> (its lines, IPython's execution count for a cell, else None)
Sources = dict[str, tuple[list[str], int | None]]

_CELLS: dict[str, int] = {}  # on a rank: the cells registered, filename -> execution count
_FILE_LINE = re.compile(r'File "(?P<name>[^"\n]+)", line (?P<line>\d+)')


def lines_of(filenames: set[str]) -> Sources:
    """The driver's lines of `filenames` (those it has), each with its cell number."""
    cells = _cell_numbers()
    found: Sources = {}
    for name in sorted(filenames):
        lines = linecache.getlines(name)
        if lines:
            found[name] = (list(lines), cells.get(name))
    return found


def register(sources: Sources) -> None:
    """Make the driver's lines the ones this process's tracebacks show. An entry without a
    modification time is one linecache never checks against a file (as IPython's cells)."""
    for name, (lines, cell) in sources.items():
        linecache.cache[name] = (sum(map(len, lines)), None, list(lines), name)
        if cell is not None:
            _CELLS[name] = cell


def name_cells(text: str) -> str:
    """`File "/tmp/ipykernel_1/4.py", line 5` as IPython writes it: `Cell In[3], line 5`."""
    if not _CELLS:
        return text

    def named(match: re.Match[str]) -> str:
        cell = _CELLS.get(match["name"])
        return match[0] if cell is None else f"Cell In[{cell}], line {match['line']}"

    return _FILE_LINE.sub(named, text)


def _cell_numbers() -> dict[str, int]:
    """IPython's own map of its cells' filenames to execution counts, when a shell runs here."""
    ipython = sys.modules.get("IPython")
    shell: Any = ipython.get_ipython() if ipython is not None else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return {k: v for k, v in names.items() if isinstance(v, int)} if isinstance(names, dict) else {}
