"""The paper's Last / Best tables with a user's runs beside them (``rpg-eval table``): layouts
(``layout``), inputs (``inputs``: the paper's numbers, runs' files), building and ranking (``build``),
rendering (``render``: Markdown, LaTeX, CSV) and the command (``cli``). These names are its API.
"""

from .build import BOLD, UNDERLINE, BuiltTable, Cell, Row, build_table, build_tables
from .cli import main
from .inputs import DEFAULT_PAPER, import_paper, load_paper, load_runs
from .layout import Layout, RowSpec, TableError, TableSpec, benchmark_key, load_layout
from .render import FORMATS, tex_escape, to_frame, to_latex, to_markdown, write_outputs

__all__ = ["BOLD", "DEFAULT_PAPER", "FORMATS", "UNDERLINE", "BuiltTable", "Cell", "Layout", "Row", "RowSpec",
           "TableError", "TableSpec", "benchmark_key", "build_table", "build_tables",
           "import_paper", "load_layout", "load_paper", "load_runs", "main", "tex_escape", "to_frame",
           "to_latex", "to_markdown", "write_outputs"]  # fmt: skip
