"""The plugin machinery, above the session it composes.

* :mod:`.base`: :class:`~.base.FrameworkPlugin`, the lifecycle every plugin shares
  (idempotent attach, version check, config resolution, the session registry, the
  gate of a framework's own checkpoints);
* :mod:`.torch_adapter` and :mod:`.torch_plugin`: plain PyTorch, on the same seam.

Framework plugins import only :mod:`scout_core.plugin_api` and the public names of
:mod:`scout_core` (``docs/plugins.md``).
"""
