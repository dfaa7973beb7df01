"""The DeepSpeed releases this plugin supports, checked when SCOUT is switched on.

The plugin reads engine internals that DeepSpeed does not promise to keep stable
(``engine._config._param_dict``, the ZeRO-3 partition attributes ``ds_tensor`` /
``ds_numel``, the pipeline topology). A release outside the tested range may have
moved them, so activation refuses it with a message naming both versions instead
of failing later inside a replay.
"""

from __future__ import annotations

import re

from scout_core.errors import UnsupportedSetupError

__all__ = ["SUPPORTED_DEEPSPEED", "check_version", "parse_version"]

SUPPORTED_DEEPSPEED = ((0, 19), (0, 20))
"""``[low, high)`` as (major, minor): every 0.19.x release; the one tested is 0.19.8."""


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``"0.19.8"`` or ``"0.19.8+abc"``."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    if match is None:
        raise UnsupportedSetupError(f"cannot read the DeepSpeed version {text!r}")
    return int(match.group(1)), int(match.group(2))


def check_version(version: str | None = None) -> str:
    """Raise :class:`UnsupportedSetupError` unless ``version`` (default: installed) is supported.

    Returns the version string that was checked.
    """
    if version is None:
        import deepspeed

        version = str(deepspeed.__version__)
    low, high = SUPPORTED_DEEPSPEED
    got = parse_version(version)
    if not low <= got < high:
        raise UnsupportedSetupError(
            f"scout-deepspeed supports DeepSpeed >={low[0]}.{low[1]},<{high[0]}.{high[1]}; "
            f"DeepSpeed {version} is installed. Install a supported release "
            f"(pip install 'deepspeed>={low[0]}.{low[1]},<{high[0]}.{high[1]}') or a "
            "scout-deepspeed that declares this one."
        )
    return version
