"""How SCOUT meets a training framework: the adapter protocol and the plugin machinery.

:mod:`.adapter` is the protocol a plugin implements, :mod:`.adapter_base` the part
every adapter shares, :mod:`.discovery` finds repeated layers, :mod:`.torch_adapter`
is the plain-PyTorch adapter, and :mod:`.registry` loads plugins from the
``scout.plugins`` entry-point group. Framework plugins import only
:mod:`scout_core.plugin_api` and the public names of :mod:`scout_core`.
"""
