"""Megatron's RerunStateMachine exit codes stay Megatron's: SCOUT refuses them for hangs."""

from __future__ import annotations

import pytest

from scout_core import Config, ConfigError


def test_rerun_state_machine_exit_codes_are_reserved(megatron_core: None) -> None:
    from megatron.core import rerun_state_machine as rsm

    codes = {rsm.EXIT_CODE_RESUME_TO_DISAMBIGUATE, rsm.EXIT_CODE_FAILED_ON_RESULT_VALIDATION}
    assert codes == {16, 17}
    for code in codes:
        with pytest.raises(ConfigError, match=f"must not be {code}"):
            Config(hang_exit_code=code)
    assert Config().hang_exit_code not in codes
