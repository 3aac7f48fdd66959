"""One public key, one principal: ``hpbroker keys allow`` refuses a key the allowlist has under
another name (and takes ``--name``), a broker refuses to start on an allowlist holding a key
under two names, and a reload that finds one keeps the name the key had."""

from __future__ import annotations

import logging
import shutil

import pytest
import zmq

from hpbroker.cli import main
from hpbroker.errors import InvalidConfigError
from hpbroker.security import keys
from hpbroker.security.authenticator import AllowlistAuthenticator, read_allowlist


@pytest.fixture
def allowlist(tmp_path):
    keys.generate_key_pair(tmp_path / "keys", "alice")
    keys.generate_key_pair(tmp_path / "keys", "bob")
    directory = tmp_path / "allow"
    keys.allow_key(tmp_path / "keys" / "alice.key", directory)
    return directory


def test_allow_refuses_a_key_already_allowlisted_under_another_name(tmp_path, allowlist):
    copy = tmp_path / "aaa-admin.key"
    shutil.copy(tmp_path / "keys" / "alice.key", copy)
    with pytest.raises(InvalidConfigError,
                       match=r"already on the allowlist as 'alice' .*revoke 'alice' first"):
        keys.allow_key(copy, allowlist)
    with pytest.raises(InvalidConfigError, match="already on the allowlist as 'alice'"):
        keys.allow_key(tmp_path / "keys" / "alice.key", allowlist, name="root")
    assert sorted(p.name for p in allowlist.iterdir()) == ["alice.key"]


def test_allow_takes_a_name_and_prints_the_principal(tmp_path, allowlist, capsys):
    assert main(["keys", "allow", str(tmp_path / "keys" / "bob.key"), "--allowlist", str(allowlist),
                 "--name", "robert"]) == 0
    assert "allowlisted principal 'robert'" in capsys.readouterr().out
    bob = keys.load_public_key(tmp_path / "keys" / "bob.key")
    assert keys.load_public_key(allowlist / "robert.key") == bob
    assert main(["keys", "allow", str(tmp_path / "keys" / "bob.key"), "--allowlist", str(allowlist),
                 "--name", "a/b"]) == 1
    assert "bad key name" in capsys.readouterr().err


def test_a_strict_read_refuses_one_key_under_two_names(allowlist):
    shutil.copy(allowlist / "alice.key", allowlist / "aaa-admin.key")
    expected = f"{allowlist / 'alice.key'} and {allowlist / 'aaa-admin.key'} hold the same public key"
    with pytest.raises(InvalidConfigError, match=expected):
        read_allowlist(str(allowlist), strict=True)


def test_a_reload_keeps_the_name_a_key_had_and_skips_the_other_with_an_error(allowlist, caplog):
    context = zmq.Context()
    authenticator = AllowlistAuthenticator(context, str(allowlist))
    try:
        authenticator.start()
        assert authenticator.principals() == {"alice"}
        shutil.copy(allowlist / "alice.key", allowlist / "aaa-admin.key")  # first in sorted order
        with caplog.at_level(logging.ERROR):
            assert authenticator.reload() == (frozenset(), frozenset())
        assert authenticator.principals() == {"alice"}
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"skipped {allowlist / 'aaa-admin.key'}: it holds the same public key as "
                   f"{allowlist / 'alice.key'}" in e for e in errors), errors
    finally:
        authenticator.stop()
        context.destroy(linger=0)
