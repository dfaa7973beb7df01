"""How SCOUT meets a training framework: the adapter protocol, below :mod:`scout_core.plugin`.

:mod:`.adapter` is the protocol, :mod:`.adapter_base` its shared part, :mod:`.discovery` finds
repeated layers, :mod:`.versions` checks version ranges, :mod:`.registry` loads the
``scout.plugins`` entry points, :mod:`.pending` is a not-yet-built plugin's placeholder.
Plugins import only :mod:`scout_core.plugin_api` and :mod:`scout_core` (docs/plugins.md).
"""
