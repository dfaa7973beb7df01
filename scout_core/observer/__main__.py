"""``python -m scout_core.observer '<spec json>'``: run one rank's observer process.

A separate entry module, so running it does not re-import a module ``__init__`` imported.
"""

from scout_core.observer.process import run

run()
