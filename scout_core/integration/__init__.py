"""How SCOUT meets a training framework: the adapter protocol and the plugin machinery.

* :mod:`.adapter`: the protocol a plugin's adapter implements; :mod:`.adapter_base`:
  the part every adapter shares; :mod:`.discovery`: finds repeated layers;
* :mod:`.plugin_base`: :class:`FrameworkPlugin`, the lifecycle every plugin shares
  (idempotent attach, version check, config resolution, the session registry);
  :mod:`.versions`: the version-range checker it uses;
* :mod:`.torch_adapter` and :mod:`.torch_plugin`: plain PyTorch, on the same seam;
* :mod:`.registry`: loads plugins from the ``scout.plugins`` entry-point group;
  :mod:`.pending`: the placeholder a not-yet-built plugin registers.

Framework plugins import only :mod:`scout_core.plugin_api` and the public names of
:mod:`scout_core` (``docs/plugins.md``).
"""
