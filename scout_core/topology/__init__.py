"""Where each rank sits: mesh addresses, the parallel layout, and SCOUT's peer groups.

:mod:`.mesh` names the axes ``(d, s, t, p, c, e)`` and derives who is whose peer; :mod:`.groups`
creates SCOUT's own diagnostic Gloo groups for them (never the training communicator, never
``WORLD``); :mod:`.shards` reaches the part of a sharded tensor this rank holds.
"""
