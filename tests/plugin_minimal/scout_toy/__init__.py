"""The smallest SCOUT plugin: toyframe's facts, written from ``docs/plugins.md`` alone.

Which objects are toyframe's (``prefixes``), where its SCOUT section is, its version,
and where the model and optimizer are; the core does the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from scout_core import Config
from scout_core.plugin_api import FrameworkPlugin, TorchAdapter, discover_modules, unwrap

__all__ = ["ToyPlugin", "plugin"]


class ToyPlugin(FrameworkPlugin):
    """toyframe's ``Engine``: a DDP model and an SGD optimizer."""

    name: ClassVar[str] = "toy"
    distribution: ClassVar[str] = "scout-toy"
    framework: ClassVar[str] = "toyframe"
    supported: ClassVar[str] = ">=1.0,<2.0"
    prefixes: ClassVar[tuple[str, ...]] = ("toyframe.",)
    section_name: ClassVar[str] = 'toyframe config "scout" section'

    def framework_version(self) -> str | None:
        import toyframe  # a test module: no distribution metadata

        return str(toyframe.__version__)

    def config_section(self, obj: Any) -> Mapping[str, Any] | None:
        section: Mapping[str, Any] | None = obj.config.get("scout")
        return section

    def build_adapter(self, obj: Any, config: Config, *args: Any, **kwargs: Any) -> TorchAdapter:
        found = discover_modules(
            unwrap(obj.module),
            layers=config.layers,
            embedding=config.embedding,
            lm_head=config.lm_head,
        )
        return TorchAdapter(obj.module, [obj.optimizer], found)


plugin = ToyPlugin()
"""What a ``scout.plugins`` entry point would name (this test plugin is not installed)."""
