"""What SCOUT writes down and how it is read back and shown.

:mod:`.record` is the evidence record and its schemas (verdicts, gate decisions,
incidents); :mod:`.evidence` the writer and the one place to import evidence from;
:mod:`.reading` reads a report directory strictly or leniently. ``scout report`` draws
from :mod:`.timeline` in three views: :mod:`.terminal` (rich), :mod:`.page` (HTML) and
:mod:`.figures` (matplotlib); :mod:`.render` is the plain fixed-width table.
"""
