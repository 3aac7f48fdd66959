"""The Spark source's ``fetchVia = frontend`` without Spark: splits fetched through the broker's
ZeroMQ front-end (``ReadConfig.fetch_via``) read exactly what the data ports read."""

from __future__ import annotations

import pytest
from topic_data import as_tuples, fill_topic, reference

from hpbroker.errors import InvalidConfigError
from hpbroker.spark.columns import RECORD_FIELDS, arrow_schema
from hpbroker.spark.planning import OffsetSpec, plan_read
from hpbroker.spark.reading import ReadConfig, read_range

ALL = arrow_schema([name for name, _ in RECORD_FIELDS])


def test_splits_read_through_the_frontend_are_the_data_ports_records(bootstrap):
    fill_topic(bootstrap, "via-frontend", records=1500)
    expected = reference(bootstrap, "via-frontend")
    splits = plan_read(bootstrap, ["via-frontend"], OffsetSpec("earliest"), OffsetSpec("latest"),
                       max_records_per_split=200)
    config = ReadConfig(fetch_max_bytes=4096, records_per_batch=64, fetch_via="frontend")
    rows = [row for split in splits for batch in read_range(bootstrap, split, ALL, config)
            for row in batch.to_pylist()]
    assert len(rows) == 1500 and as_tuples(rows) == expected


def test_fetch_via_is_checked():
    with pytest.raises(InvalidConfigError, match="fetch_via"):
        ReadConfig(fetch_via="tcp")


def test_the_option_fetch_via_is_parsed_or_refused_by_name():
    pytest.importorskip("pyspark")
    from hpbroker.spark.datasource import ReadOptions

    assert ReadOptions({"topic": "t", "fetchVia": "frontend"}).read_config.fetch_via == "frontend"
    assert ReadOptions({"topic": "t"}).read_config.fetch_via == "data_port"
    with pytest.raises(ValueError, match="fetchVia"):
        ReadOptions({"topic": "t", "fetchVia": "zmq"})
