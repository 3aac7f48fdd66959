"""Reading the cluster's token key when ZooKeeper fails in the middle: an orderly
CoordinationError (the broker's start halts as for any other ZooKeeper failure), never a raw
kazoo exception.  A real ZooKeeper."""

from __future__ import annotations

import pytest

from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import ZkCredentials, get_or_create_token_key
from hpbroker.errors import CoordinationError


def test_a_lost_connection_while_reading_the_token_key_is_a_coordination_error(zookeeper, chroot):
    credentials = ZkCredentials("hpbroker", "cluster-secret")
    session = connect(zookeeper.connect_string + chroot, session_timeout_s=10.0, credentials=credentials)
    try:
        assert len(get_or_create_token_key(session)) == 32
        session.client.stop()  # every call now fails as after a lost session
        with pytest.raises(CoordinationError, match="cannot read the token key"):
            get_or_create_token_key(session)
    finally:
        session.client.start()
        session.client.delete("/", recursive=True)
        session.close()
