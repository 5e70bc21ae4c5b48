"""What a reader looks at: ``rpg-eval table`` (``tables/``: the paper's Last / Best tables with runs
beside them), ``rpg-eval plot`` (``plots``: training curves and eval scores against step) and
``rpg-eval report`` (``page``: one self-contained HTML page with the table, the plots and a sample
browser). Reads files only; imports nothing from the training side.
"""
