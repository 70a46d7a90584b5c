"""Issue 17 without a broker: what the SQL endpoint lets through, identifiers, redaction, private files.

Failed on the code before the fix (none of these checks existed: any SQL ran, `--database` was
pasted into SQL, the DSN was printed and stored whole).
"""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from vigil.schemas.signing import Keyring
from vigil.secrets import Redactor, _RedactingStream, private_dir, private_tree, redact_dsn, write_private
from vigil.settings import Settings
from vigil.streams.history import HistoryError, check_identifier, read_only_statement


@pytest.mark.parametrize("sql, kept", [
    ("SELECT 1", "SELECT 1"),
    ("  select count() from vigil.alerts ;  ", "select count() from vigil.alerts"),
    ("WITH 1 AS x SELECT x -- done; really", "WITH 1 AS x SELECT x"),
    ("(SELECT 1)", "(SELECT 1)"),
    ("SELECT 'a;b', \"c;d\", `e;f` /* ; */", "SELECT 'a;b', \"c;d\", `e;f`"),
    ("SHOW TABLES FROM vigil", "SHOW TABLES FROM vigil"),
    ("DESCRIBE vigil.alerts", "DESCRIBE vigil.alerts"),
    ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1"),
    ("SELECT * FROM vigil.ettr(since = '2026-03-02 00:00:00', until = '2026-03-04 00:00:00')",
     "SELECT * FROM vigil.ettr(since = '2026-03-02 00:00:00', until = '2026-03-04 00:00:00')"),
    ("SELECT 'it''s' AS s", "SELECT 'it''s' AS s"),
    ("SELECT /* a /* nested */ comment */ 1", "SELECT /* a /* nested */ comment */ 1"),
])
def test_one_read_statement_passes_trimmed(sql, kept):
    assert read_only_statement(sql) == kept


@pytest.mark.parametrize("sql, why", [
    ("SELECT * FROM file('/etc/hostname')", "reaches outside"),
    ("select * from FILE('/etc/hostname')", "reaches outside"),
    ("SELECT * FROM `file` ('/etc/hostname')", "reaches outside"),
    ("SELECT * FROM url('http://x/', CSV)", "reaches outside"),
    ("SELECT * FROM remote('h:9000', system.one)", "reaches outside"),
    ("SELECT * FROM s3('https://b/k')", "reaches outside"),
    ("SELECT * FROM executable('sh', 'TSV', 'x String')", "reaches outside"),
    ("DESCRIBE TABLE file('/etc/passwd')", "reaches outside"),
    ("DROP TABLE vigil.alerts", "only read statements"),
    ("INSERT INTO vigil.alerts SELECT 1", "only read statements"),
    ("SET readonly = 0", "only read statements"),
    ("USE system", "only read statements"),
    ("ALTER TABLE vigil.alerts DELETE WHERE 1", "only read statements"),
    ("SELECT 1; SELECT 2", "one statement at a time"),
    ("SELECT 1; DROP TABLE vigil.alerts", "one statement at a time"),
    ("SELECT 1 INTO OUTFILE '/tmp/x'", "INTO OUTFILE"),
    ("SELECT 1 /* never closed", "not closed"),
    ("SELECT 'never closed", "not closed"),
    ("", "no SQL statement"),
    ("  ;  ; ", "no SQL statement"),
])
def test_everything_else_is_refused_with_the_reason(sql, why):
    with pytest.raises(HistoryError, match=why):
        read_only_statement(sql)


@pytest.mark.parametrize("name", ["x; DROP DATABASE vigil", "vigil.alerts", "1abc", "", "a" * 65, "ví", "a-b", "`x`"])
def test_identifiers_are_checked(name):
    with pytest.raises(HistoryError, match="not a plain identifier"):
        check_identifier(name)
    assert check_identifier("vigil_2") == "vigil_2"


def test_dsn_passwords_are_redacted_everywhere():
    assert redact_dsn("http://vigil:pa:ss@ch:8123/?database=v") == "http://vigil:***@ch:8123/?database=v"
    assert redact_dsn("chdb:///tmp/h?password=abc123") == "chdb:///tmp/h?password=***"
    assert redact_dsn("http://ch:8123") == "http://ch:8123"
    r = Redactor(["hunter2/secret"])
    text = ("could not open ClickHouse at https://u:hunter2%2Fsecret@h/: auth failed for hunter2/secret "
            "(sasl.password=abc) http://other:zzz@x/")
    out = r(text)
    assert "hunter2" not in out and "zzz" not in out and "abc" not in out and out.count("***") == 4


def test_the_process_output_is_redacted_whoever_writes():
    inner = io.StringIO()
    stream = _RedactingStream(inner, Redactor(["t0ken-value"]))
    print("token t0ken-value and http://a:b1@c/", file=stream)
    assert inner.getvalue() == "token *** and http://a:***@c/\n"


def test_settings_and_keyrings_do_not_show_their_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("VIGIL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("VIGIL_CLICKHOUSE_DSN", "http://vigil:dsn-secret-1@ch:8123")
    monkeypatch.setenv("VIGIL_KAFKA_SASL_PASSWORD", "sasl-secret-2")
    monkeypatch.setenv("VIGIL_DECISION_KEYS", json.dumps({"k": "decision-secret-3-0123456789"}))
    s = Settings()
    shown = repr(s) + str(s) + repr(s.decision_keyring())
    for secret in ("dsn-secret-1", "sasl-secret-2", "decision-secret-3"):
        assert secret not in shown
    assert set(s.secrets()) >= {"dsn-secret-1", "sasl-secret-2", "decision-secret-3-0123456789"}
    ring = s.decision_keyring()
    assert ring.signing_key == "k" and isinstance(ring, Keyring)


def test_short_or_misnamed_decision_keys_are_refused():
    with pytest.raises(ValueError, match="at least 16"):
        Keyring({"k": b"short"})
    with pytest.raises(ValueError, match="key id"):
        Keyring({"k k": b"0123456789abcdef"})
    with pytest.raises(ValueError, match="not among"):
        Keyring({"k": b"0123456789abcdef"}, signing_key="other")


def test_state_files_are_private(tmp_path):
    state = private_dir(tmp_path / "state")
    write_private(state / "stack.json", "{}")
    legacy = state / "history"
    legacy.mkdir(mode=0o755)
    (legacy / "data").write_text("x")
    os.chmod(legacy / "data", 0o644)
    assert private_tree(legacy) == 2
    for path in (state, legacy):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for path in (state / "stack.json", legacy / "data"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
