"""Scale, simulated: SCOUT's grouping and decisions on published layouts, no processes.

:mod:`.layouts` parses layout strings (``"TP8 PP16 DP128"``) and lists the PAPER.md
Table 2 layouts; :mod:`.scale` builds every rank's address and peer group, runs C3 and
cross-PG diagnosis on synthetic evidence with a planted culprit, times each part and
says how SCOUT's diagnostic traffic grows with the job. ``scout simulate`` prints it.
"""
