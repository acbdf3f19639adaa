"""The management API's token (decision 0032): nothing without it."""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request

from conftest import cistern_bin, run


def _request(d, method, path, token=None, headers=None, body=None):
    """(status, body) of a raw request; `token` None sends no Authorization."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        h.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(d.api_url + path, data=data, method=method, headers=h)
    # A fresh opener: no cookie jar, nothing added behind the test's back.
    opener = urllib.request.build_opener()
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def test_token_file_is_private_and_required(daemon, pool):
    path = daemon.state_dir / "api.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = daemon.token
    assert len(token) == 64

    # No token, a wrong token: 401 with a JSON error, and nothing changes.
    for t in (None, "0" * 64, token[:-1]):
        st, hdrs, body = _request(daemon, "DELETE", f"/v1/pools/{pool}", token=t)
        assert st == 401, body
        assert json.loads(body)["kind"] == "Unauthorized"
        assert "Bearer" in hdrs.get("WWW-Authenticate", "")
    st, _, _ = _request(daemon, "GET", "/metrics")
    assert st == 401
    assert daemon.cli_json("pool", "list")  # the pool is still there

    st, _, body = _request(daemon, "GET", "/v1/pools", token=token)
    assert st == 200 and pool in body

    # The token survives a restart.
    daemon.restart()
    assert daemon.token == token


def test_cli_finds_token_or_takes_it(daemon, pool, tmp_path):
    # The same user on the same machine: found through the runtime directory.
    assert pool in daemon.cli("pool", "list", "-H").stdout
    # Somewhere the discovery file is not: the CLI needs --token / CISTERN_TOKEN.
    env = dict(daemon.env(), CISTERN_RUNTIME_DIR=str(tmp_path / "elsewhere"), HOME=str(tmp_path))
    env.pop("XDG_RUNTIME_DIR", None)
    p = run([cistern_bin(), "pool", "list"], check=False, env=env)
    assert p.returncode != 0
    assert "401" in p.stderr or "token" in p.stderr.lower(), p.stderr
    p = run([cistern_bin(), "pool", "list", "-H"], env=dict(env, CISTERN_TOKEN=daemon.token))
    assert pool in p.stdout
    p = run([cistern_bin(), "--token", daemon.token, "set", "compression=lz4", pool], env=env)
    # A token typed on the command line never reaches the pool's history.
    hist = daemon.cli("pool", "history", pool).stdout
    assert "compression=lz4" in hist
    assert daemon.token not in hist and "--token <redacted>" in hist, hist


def test_metrics_open_by_config(make_daemon):
    d = make_daemon(config="[api]\nmetrics_open = true\n")
    st, _, body = _request(d, "GET", "/metrics")
    assert st == 200 and "cistern_" in body
    st, _, _ = _request(d, "GET", "/v1/pools")
    assert st == 401


def test_browser_session_is_same_origin_only(daemon, pool):
    origin = {"Origin": daemon.api_url}
    # A wrong token gets no cookie.
    st, hdrs, _ = _request(daemon, "POST", "/v1/session", headers=origin, body={"token": "nope"})
    assert st == 401 and hdrs.get("Set-Cookie") is None
    # A login from another site is refused.
    st, _, _ = _request(
        daemon, "POST", "/v1/session", headers={"Origin": "http://evil.example"}, body={"token": daemon.token}
    )
    assert st == 403
    st, hdrs, _ = _request(daemon, "POST", "/v1/session", headers=origin, body={"token": daemon.token})
    assert st == 204
    cookie = hdrs["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert daemon.token not in cookie
    session = {"Cookie": cookie.split(";")[0]}

    # The cookie reads, and acts from the same origin...
    st, _, body = _request(daemon, "GET", "/v1/pools", headers=session)
    assert st == 200 and pool in body
    st, _, body = _request(
        daemon, "POST", "/v1/snapshots", headers={**session, **origin}, body={"names": [f"{pool}@ui"]}
    )
    assert st in (200, 201), body
    # ...but not from another site's page.
    st, _, body = _request(
        daemon,
        "POST",
        "/v1/snapshots",
        headers={**session, "Origin": "http://evil.example"},
        body={"names": [f"{pool}@evil"]},
    )
    assert st == 403, body
    st, _, _ = _request(
        daemon, "DELETE", f"/v1/pools/{pool}", headers={**session, "Sec-Fetch-Site": "cross-site"}
    )
    assert st == 403
    snaps = daemon.cli("list", "-H", "-t", "snapshot", "-o", "name").stdout.split()
    assert f"{pool}@ui" in snaps and f"{pool}@evil" not in snaps
