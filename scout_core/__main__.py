"""``python -m scout_core``: the ``scout`` command, for environments without the script."""

import sys

from scout_core.cli.main import main

sys.exit(main())
