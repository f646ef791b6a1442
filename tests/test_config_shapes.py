"""A config file of any JSON shape never stops the app: servers.json's entries are read where they have
the right shape and the rest is left out (before, {"servers": 1} raised TypeError on every start)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import remote_servers

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)


def test_a_servers_value_of_the_wrong_shape_reads_as_no_server(tmp_path, monkeypatch):
    monkeypatch.setattr(remote_servers, "servers_path", lambda: tmp_path / "servers.json")
    for value in (1, "x", {"url": "u"}, None):
        (tmp_path / "servers.json").write_text(json.dumps({"servers": value}))
        assert remote_servers.load_servers() == []
    (tmp_path / "servers.json").write_text(json.dumps({"servers": [1, {"url": "http://h/v1", "model": "m"}]}))
    assert [s.url for s in remote_servers.load_servers()] == ["http://h/v1"]  # the good entry is kept


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=JSON)
def test_servers_json_of_any_shape_loads(tmp_path, monkeypatch, data):
    monkeypatch.setattr(remote_servers, "servers_path", lambda: tmp_path / "servers.json")
    (tmp_path / "servers.json").write_text(json.dumps({"servers": data}))
    assert all(isinstance(s.url, str) for s in remote_servers.load_servers())


@settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed",
                                             "dry_base", "dry_multiplier"]),
                            st.one_of(st.integers(min_value=-10**500, max_value=10**500), JSON), max_size=6))
def test_sampling_settings_of_any_size_read_as_values_or_defaults(data):
    """A Generation value such as 1 followed by 400 zeros raised OverflowError (float() and isfinite)."""
    from backend.sampling import SamplingParams

    SamplingParams.from_dict(data).check()  # whatever the file holds: a valid setting
