"""hpbroker: a small-footprint Kafka-style log broker.

Layout (imports point down this list, never up):

- ``hpbroker.errors``   the exception table shared by every layer and the wire protocol
- ``hpbroker._core``    compiled record-batch core (Cython): build, scan, validate, decode
- ``hpbroker.records``  the public face of the record format over ``_core``
- ``hpbroker.io``       storage: segments, indexes and the partition log (no zmq, no kazoo)
- ``hpbroker.protocol`` the wire protocol, sans I/O: requests and responses to and from bytes
- ``hpbroker.cli``      the ``hpbroker`` command
"""

__version__ = "0.1.0"
