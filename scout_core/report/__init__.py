"""``scout report``'s views of a report (:mod:`scout_core.records` reads it).

:mod:`.timeline` is what the report shows, as plain data; :mod:`.terminal` (rich),
:mod:`.page` (HTML) and :mod:`.figures` (matplotlib) draw it; :mod:`.render` is the
plain fixed-width table.
"""
