"""Security: who may connect, and what each principal may do (docs/SECURITY.md).

With ``security = "curve"`` a broker's front-end is a CurveZMQ server that admits only the public
keys on its allowlist (``authenticator``); the key's name is the request's *principal*; every
request is checked against ACLs (``acls``) kept in ZooKeeper; the TCP data ports serve only
connections that present a fetch token (``tokens``, ``data_port``) the front-end issued.

Modules here are kazoo-free (ZooKeeper access is ``hpbroker.coord``'s): ``keys`` (key files),
``client`` (a client's key pair and the broker's public key), ``authenticator`` (the ZAP handler),
``broker`` (the arbiter's one security object), ``acls`` (the pure ACL model), ``tokens`` (fetch
tokens), ``data_port`` (the workers' check of tokens and ACLs).
"""
