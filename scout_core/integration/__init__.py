"""How SCOUT meets a training framework: the adapter protocol (below the session).

The plugin machinery that composes a session sits above it, in :mod:`scout_core.plugin`.

* :mod:`.adapter`: the protocol a plugin's adapter implements; :mod:`.adapter_base`:
  the part every adapter shares; :mod:`.discovery`: finds repeated layers;
* :mod:`.versions`: the version-range checker plugins use;
* :mod:`.registry`: loads plugins from the ``scout.plugins`` entry-point group;
  :mod:`.pending`: the placeholder a not-yet-built plugin registers.

Framework plugins import only :mod:`scout_core.plugin_api` and the public names of
:mod:`scout_core` (``docs/plugins.md``).
"""
