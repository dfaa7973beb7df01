"""Scale, simulated: SCOUT's grouping and decisions on published layouts, no processes.

:mod:`.layouts` parses layout strings (``"TP8 PP16 DP128"``) and lists the PAPER.md
Table 2 layouts; :mod:`.scale` runs grouping, C3 and cross-PG diagnosis on synthetic
evidence with a planted culprit, timed, with the diagnostic traffic per rank.
"""
