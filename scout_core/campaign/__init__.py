"""``scout campaign``: randomized fault injections, reproducible from a seed, scored.

* :mod:`.plan`: the setups (the core's, and those plugins register under the
  ``scout.campaign_setups`` entry point), and the trials a seed draws;
* :mod:`.config`: the one SCOUT configuration and fault timing every trial uses;
* :mod:`.torch_setups`: the rank body under DDP, FSDP2, HSDP and DP x TP (each
  framework plugin ships its own);
* :mod:`.runner`: runs trials one after another, each in its own report directory;
* :mod:`.score`: claims, outcomes and the scores, from the evidence (docs/campaign.md).
"""
