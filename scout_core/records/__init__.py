"""What SCOUT writes down and how it is read back.

:mod:`.record` is the evidence record and its schemas (verdicts, gate decisions,
incidents); :mod:`.evidence` the writer and the one place to import evidence from;
:mod:`.reading` reads a report directory strictly or leniently; :mod:`.console` logs
a record that names a culprit, in the words of :mod:`.wording`. Showing a report is
:mod:`scout_core.report`'s.
"""
