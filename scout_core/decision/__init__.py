"""How SCOUT decides: C3 consensus, signatures, cross-PG diagnosis and the checkpoint gate.

:mod:`.c3` is the consensus rule and exchange, :mod:`.signature` the 64-bit tensor evidence,
:mod:`.diagnosis` the cross-PG reading of slow groups, :mod:`.gate` Algorithm 3's checkpoint gate.
"""
