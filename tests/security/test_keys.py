"""Key files: generate, read, list, allowlist, revoke, and the ``hpbroker keys`` command."""

from __future__ import annotations

import stat

import pytest
import zmq
import zmq.auth

from hpbroker.cli import main
from hpbroker.errors import InvalidConfigError
from hpbroker.security import keys


def test_generate_writes_a_pair_zmq_auth_reads_with_the_secret_private(tmp_path):
    pair = keys.generate_key_pair(tmp_path / "k", "alice")
    public_path, secret_path = tmp_path / "k" / "alice.key", tmp_path / "k" / "alice.key_secret"
    assert pair.path == secret_path and pair.name == "alice"
    assert zmq.auth.load_certificate(public_path) == (pair.public_key, None)
    assert zmq.auth.load_certificate(secret_path) == (pair.public_key, pair.secret_key)
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert zmq.curve_public(pair.secret_key) == pair.public_key  # a real pair


def test_generate_never_overwrites_a_key(tmp_path):
    first = keys.generate_key_pair(tmp_path, "alice")
    with pytest.raises(InvalidConfigError, match="alice.key exists"):
        keys.generate_key_pair(tmp_path, "alice")
    assert keys.load_key_pair(tmp_path / "alice.key_secret") == first
    (tmp_path / "bob.key_secret").write_text("whatever")  # half a pair is refused too
    with pytest.raises(InvalidConfigError, match="bob.key_secret exists"):
        keys.generate_key_pair(tmp_path, "bob")
    assert not (tmp_path / "bob.key").exists()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "é", "x" * 101, "../up"])
def test_bad_key_names_are_refused(tmp_path, name):
    with pytest.raises(InvalidConfigError, match="bad key name"):
        keys.generate_key_pair(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_zmq_auth_certificates_are_read(tmp_path):
    public_path, secret_path = zmq.auth.create_certificates(str(tmp_path), "carol")
    pair = keys.load_key_pair(secret_path)
    assert pair.name == "carol"
    assert keys.load_public_key(public_path) == pair.public_key
    assert [k.name for k in keys.list_keys(tmp_path)] == ["carol"]


def test_public_file_given_where_a_secret_is_needed_says_so(tmp_path):
    keys.generate_key_pair(tmp_path, "alice")
    with pytest.raises(InvalidConfigError, match="holds only a public key"):
        keys.load_key_pair(tmp_path / "alice.key")


@pytest.mark.parametrize("content, error", [
    (None, "does not exist"),
    ("hello\n", "not a CURVE key file"),
    ('curve\n    public-key = "short"\n', "not 40 z85 characters"),
    ('curve\n    public-key = "' + "~" * 40 + '"\n', "not 40 z85 characters"),
])
def test_bad_key_files_are_named_in_the_error(tmp_path, content, error):
    path = tmp_path / "x.key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidConfigError, match=error) as raised:
        keys.load_public_key(path)
    assert str(path) in raised.value.message


def test_list_keys_pairs_and_skips_bad_files(tmp_path):
    keys.generate_key_pair(tmp_path, "b")
    a = keys.generate_key_pair(tmp_path, "a")
    (tmp_path / "a.key_secret").rename(tmp_path / "elsewhere")  # a's public file alone
    (tmp_path / "junk.key").write_text("nothing\n")
    (tmp_path / "notes.txt").write_text("x")
    listed = keys.list_keys(tmp_path)
    assert [(k.name, k.has_secret) for k in listed] == [("a", False), ("b", True)]
    assert listed[0].public_key == a.public_key and listed[0].path == tmp_path / "a.key"
    with pytest.raises(InvalidConfigError, match="does not exist"):
        keys.list_keys(tmp_path / "nope")


def test_allow_copies_the_public_key_and_refuses_secrets_and_clashes(tmp_path):
    alice = keys.generate_key_pair(tmp_path / "keys", "alice")
    allowlist = tmp_path / "allow"
    target = keys.allow_key(tmp_path / "keys" / "alice.key", allowlist)
    assert target == allowlist / "alice.key" and keys.load_public_key(target) == alice.public_key
    assert keys.allow_key(tmp_path / "keys" / "alice.key", allowlist) == target  # again: no change
    with pytest.raises(InvalidConfigError, match="holds a secret key"):
        keys.allow_key(tmp_path / "keys" / "alice.key_secret", allowlist)
    keys.generate_key_pair(tmp_path / "other", "alice")
    with pytest.raises(InvalidConfigError, match="exists with another key"):
        keys.allow_key(tmp_path / "other" / "alice.key", allowlist)
    assert keys.load_public_key(target) == alice.public_key
    # what the broker's authenticator reads: the allowlist directory's public keys
    assert list(zmq.auth.load_certificates(str(allowlist)).keys()) == [alice.public_key]


def test_revoke_moves_the_key_out_of_the_allowlist(tmp_path):
    keys.generate_key_pair(tmp_path, "alice")
    moved = keys.revoke_key(tmp_path, "alice")
    assert moved == tmp_path / "revoked" / "alice.key" and not (tmp_path / "alice.key").exists()
    assert zmq.auth.load_certificates(str(tmp_path)) == {}
    with pytest.raises(InvalidConfigError, match="no key 'alice' on the allowlist"):
        keys.revoke_key(tmp_path, "alice")
    keys.allow_key(moved, tmp_path)  # allowed again, then revoked again: both revocations kept
    second = keys.revoke_key(tmp_path, "alice")
    assert second != moved and second.parent == moved.parent and moved.exists()


def test_cli_generate_list_allow_revoke(tmp_path, capsys):
    keydir, allowlist = tmp_path / "keys", tmp_path / "allow"
    assert main(["keys", "generate", "alice", "--dir", str(keydir)]) == 0
    out = capsys.readouterr().out
    public_key = keys.load_public_key(keydir / "alice.key").decode()
    assert str(keydir / "alice.key") in out and str(keydir / "alice.key_secret") in out and public_key in out
    assert main(["keys", "list", "--dir", str(keydir)]) == 0
    assert capsys.readouterr().out.split("\t")[:3] == ["alice", public_key, "public+secret"]
    assert main(["keys", "allow", str(keydir / "alice.key"), "--allowlist", str(allowlist)]) == 0
    assert "SIGHUP" in capsys.readouterr().out
    assert main(["keys", "revoke", "alice", "--allowlist", str(allowlist)]) == 0
    out = capsys.readouterr().out
    assert "SIGHUP" in out and "next connection is refused" in out
    assert not (allowlist / "alice.key").exists()


@pytest.mark.parametrize("argv, error", [
    (["keys", "generate", "a/b"], "bad key name"),
    (["keys", "generate", "alice"], "exists"),
    (["keys", "allow", "keys/alice.key_secret", "--allowlist", "allow"], "holds a secret key"),
    (["keys", "revoke", "bob", "--allowlist", "allow"], "no key 'bob'"),
    (["keys", "list", "--dir", "nope"], "does not exist"),
])
def test_cli_errors_are_one_line_and_status_1(tmp_path, monkeypatch, capsys, argv, error):
    monkeypatch.chdir(tmp_path)
    keys.generate_key_pair("keys", "alice")
    (tmp_path / "allow").mkdir()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("hpbroker keys: invalid configuration: ") and error in err
    assert len(err.strip().splitlines()) == 1
