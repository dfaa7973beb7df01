"""The plugin machinery, above the session it composes.

:mod:`.base` holds :class:`~.base.FrameworkPlugin`, the lifecycle every plugin shares;
:mod:`.torch_adapter` and :mod:`.torch_plugin` are plain PyTorch on the same seam. Plugins
import only :mod:`scout_core.plugin_api` and :mod:`scout_core` (docs/plugins.md).
"""
