"""``python -m scout_core.observer '<spec json>'``: run one rank's observer process.

A separate entry module (not ``process`` itself) so that running it does not
re-import a module the package ``__init__`` already imported.
"""

from scout_core.observer.process import run

run()
