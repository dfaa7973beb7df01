"""``python -m scout_core.cli``: the ``scout`` command."""

import sys

from scout_core.cli.main import main

sys.exit(main())
