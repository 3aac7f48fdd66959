"""Auditing: the monitoring events producers publish, and the rules that compare them with the data.

``hpbroker.audit.events`` is the event format (pure: bytes in, bytes out) shared by the producer
(``hpbroker.client``), which publishes the events, and the audit jobs (``hpbroker.spark``), which
read them.  Nothing here does I/O.
"""
