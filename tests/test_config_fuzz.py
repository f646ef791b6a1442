"""Issue 65, item 6 (the config files): `python -m lab fuzz-configs` briefly, each config's files loading as their
values or the defaults, never a crash. Its first run on the code before item 5 found a settings.json whose
Generation section nested thousands deep stopped the app at start (RecursionError in Settings.load)."""
from __future__ import annotations

import pytest

from lab.commands.fuzz_configs import CONFIGS, run_config


@pytest.mark.parametrize("name", CONFIGS)
def test_config_files_of_any_shape_load_as_values_or_defaults(name):
    stats = run_config(name, examples=120, seed=2)
    assert stats["inputs"] == 120 and not stats["findings"], stats["findings"]
    assert stats["distinct"] == 120  # the record's counts are of distinct files (it drew 73 distinct of 200 before)


def test_a_generation_section_nested_thousands_deep_loads_as_defaults():
    from lab.commands.fuzz_configs import check_settings

    import tempfile
    from pathlib import Path

    deep = b'{"generation": ' + b'{"a": ' * 400 + b"1" + b"}" * 401
    with tempfile.TemporaryDirectory() as work:
        assert check_settings(deep, Path(work)) == "repaired at save"
