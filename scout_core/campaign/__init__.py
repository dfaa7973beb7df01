"""``scout campaign``: randomized fault injections, reproducible from a seed, scored.

* :mod:`.plan`: the setups (the core's and the plugins') and the trials a seed draws;
* :mod:`.config`: the one SCOUT configuration and fault timing every trial uses;
* :mod:`.torch_setups`: the core's rank body (each framework plugin ships its own);
* :mod:`.runner`: runs trials one after another, each in its own report directory;
* :mod:`.score`: claims, outcomes and the scores, from the evidence (docs/campaign.md).
"""
