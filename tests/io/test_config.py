"""LogConfig: defaults, validation naming the field, immutability, replace."""

from __future__ import annotations

import dataclasses

import pytest

from hpbroker.errors import InvalidConfigError
from hpbroker.io import LogConfig


def test_defaults_match_the_documented_values():
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.segment_ms == 7 * 24 * 3600 * 1000
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.index_interval_bytes == 4096
    assert config.max_message_bytes == 1_048_588
    assert config.flush_messages == 10_000
    assert config.flush_ms == 1
    assert config.flush_fsync is True
    assert config.file_delete_delay_ms == 60_000


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("segment_bytes", 511),
        ("segment_bytes", 2**31),
        ("segment_ms", 0),
        ("retention_ms", -2),
        ("retention_bytes", -2),
        ("index_interval_bytes", -1),
        ("index_interval_bytes", 2**31),
        ("max_message_bytes", 55),
        ("max_message_bytes", 2**31),
        ("flush_messages", 0),
        ("flush_ms", -1),
        ("file_delete_delay_ms", -1),
    ],
)
def test_out_of_range_value_is_rejected_naming_the_field(field, value):
    with pytest.raises(InvalidConfigError, match=rf"{field} must be in \[.*got {value}"):
        LogConfig(**{field: value})


@pytest.mark.parametrize("value", [True, 1.5, "4096", None])
def test_non_int_value_is_rejected_naming_the_field(value):
    with pytest.raises(InvalidConfigError, match="index_interval_bytes must be an int"):
        LogConfig(index_interval_bytes=value)


def test_flush_fsync_must_be_a_bool():
    with pytest.raises(InvalidConfigError, match="flush_fsync"):
        LogConfig(flush_fsync=1)


def test_config_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_bytes = 1


def test_replace_validates_and_leaves_the_original_alone():
    config = LogConfig()
    smaller = config.replace(segment_bytes=4096, retention_bytes=0)
    assert (smaller.segment_bytes, smaller.retention_bytes) == (4096, 0)
    assert config.segment_bytes == 1 << 30
    with pytest.raises(InvalidConfigError, match="segment_bytes"):
        config.replace(segment_bytes=1)
    with pytest.raises(InvalidConfigError, match="no_such_field"):
        config.replace(no_such_field=1)


def test_boundary_values_are_accepted():
    LogConfig(segment_bytes=512, retention_ms=-1, retention_bytes=0, index_interval_bytes=0, flush_ms=0)
    LogConfig(segment_bytes=2**31 - 1, max_message_bytes=2**31 - 1)
