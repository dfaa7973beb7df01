"""How SCOUT decides: C3 consensus, signatures, cross-PG diagnosis and the checkpoint gate.

:mod:`.c3` is the consensus rule and its one-AllGather exchange, :mod:`.signature`
the 64-bit tensor evidence it compares, :mod:`.diagnosis` the cross-process-group
reading of slow groups (paper Figure 3), and :mod:`.gate` the pure Algorithm-3
checkpoint state machine.
"""
