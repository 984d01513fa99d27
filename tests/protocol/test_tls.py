"""HTTPS between the services: a generated CA, real servers on 127.0.0.1, real clients.

A client given the run's CA works; one without it (or with another CA) fails verification at
once, with a message naming the CA file to give. The weight server serves HTTPS to node and
trainer tokens checked against digests, as a trainer holding only its trainer token does.

`astraflow train` with security.tls (HTTPS everywhere, role tokens, and it trains) is checked on the
shared quickstart run: tests/e2e/test_quickstart_run.py::test_quickstart_over_tls.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataflow"))
from dataflow_helpers import TOKEN, ThreadedService, make_recipe  # noqa: E402

from astraflow.launch.certs import cert_hosts, create_run_certs  # noqa: E402
from astraflow.launch.security import RunSecurity  # noqa: E402
from astraflow.protocol.auth import ADMIN, NODE, TRAINER, TokenVerifier, derive_token  # noqa: E402
from astraflow.protocol.client import SyncDataflowClient, TLSError  # noqa: E402
from astraflow.protocol.tls import CA_ENV, ServerTLS, TLSConfigError, client_verify  # noqa: E402
from astraflow.weights import WeightClient, WeightStore, WeightTransferError  # noqa: E402
from astraflow.weights.server import create_weight_app, serve_in_thread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return create_run_certs(tmp_path_factory.mktemp("tls"), ["127.0.0.1", "localhost"])


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    return create_run_certs(tmp_path_factory.mktemp("other"), ["127.0.0.1"]).ca_file


@pytest.fixture(scope="module")
def https_service(certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("df")
    tls = ServerTLS.resolve(certs.cert_file, certs.key_file)
    with ThreadedService(make_recipe(tmp), tmp / "df.db", tls=tls) as svc:
        yield svc


def test_generated_files_and_names(certs):
    assert {"127.0.0.1", "localhost"} <= set(cert_hosts(certs.cert_file))
    for key in (certs.key_file, certs.ca_key_file):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError, match="--force"):
        create_run_certs(certs.ca_file.parent, ["127.0.0.1"])


def test_dataflow_over_https_needs_the_ca(https_service, certs, other_ca, monkeypatch):
    assert https_service.url.startswith("https://127.0.0.1:")
    node_token = derive_token(TOKEN, NODE)
    with SyncDataflowClient(https_service.url, node_token, ca_file=str(certs.ca_file)) as c:
        assert c.recipe().tasks.group_size == 4
        assert c.register(policies={"policy": 0}, name="tls-node").node_id
    monkeypatch.delenv(CA_ENV, raising=False)
    for ca in (None, str(other_ca)):  # system trust store, then the wrong CA
        t0 = time.monotonic()
        with SyncDataflowClient(https_service.url, node_token, ca_file=ca, retries=5) as c:
            with pytest.raises(TLSError, match="certificate verification failed.*--ca-file"):
                c.recipe()
        assert time.monotonic() - t0 < 5  # not retried: it cannot succeed on a second try
    monkeypatch.setenv(CA_ENV, str(certs.ca_file))  # the variable the launcher sets
    with SyncDataflowClient(https_service.url, TOKEN) as c:
        assert c.status()["run"]


def test_certificate_must_name_the_host(tmp_path, certs):
    """A certificate for other names does not pass for 127.0.0.1, even from the right CA."""
    only = create_run_certs(tmp_path / "named", ["example.invalid"])
    tls = ServerTLS.resolve(only.cert_file, only.key_file)
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db", tls=tls) as svc:
        with SyncDataflowClient(svc.url, TOKEN, ca_file=str(only.ca_file)) as c:
            with pytest.raises(TLSError, match="verification failed"):
                c.healthz()


def test_weight_server_over_https_with_role_tokens(tmp_path, certs, https_service, other_ca):
    store = WeightStore(tmp_path / "w")
    store.publish("policy", 0, {"w": torch.arange(12, dtype=torch.float32)})
    store.publish("policy", 1, {"w": torch.arange(12, dtype=torch.float32) + 1})
    # what a trainer holding only its trainer token does: digests from the dataflow service
    trainer_token = derive_token(TOKEN, TRAINER)
    with SyncDataflowClient(https_service.url, trainer_token, ca_file=str(certs.ca_file)) as c:
        verifier = TokenVerifier.from_digests(c.auth_verifiers())
    tls = ServerTLS.resolve(certs.cert_file, certs.key_file)
    url, stop = serve_in_thread(create_weight_app(store, verifier), tls=tls)
    try:
        assert url.startswith("https://")
        for role in (NODE, TRAINER, ADMIN):
            with WeightClient(url, derive_token(TOKEN, role), ca_file=certs.ca_file) as wc:
                update = wc.fetch_update("policy", have_version=None, want_version=1)
                assert update.version == 1 and torch.equal(update.full["w"], torch.arange(12) + 1.0)
        with WeightClient(
            url, derive_token("other-run", NODE), ca_file=certs.ca_file, retries=0
        ) as wc:
            with pytest.raises(WeightTransferError, match="refused the token"):
                wc.meta("policy")
        t0 = time.monotonic()
        with WeightClient(url, derive_token(TOKEN, NODE), ca_file=other_ca, retries=4) as wc:
            with pytest.raises(WeightTransferError, match="certificate verification failed"):
                wc.meta("policy")
        assert time.monotonic() - t0 < 5
    finally:
        stop()


def test_bad_tls_files_are_named(tmp_path, certs, other_ca):
    missing = tmp_path / "nope.pem"
    with pytest.raises(TLSConfigError, match=r"TLS certificate \(--tls-cert\): file .*nope.pem"):
        ServerTLS.resolve(missing, certs.key_file)
    with pytest.raises(TLSConfigError, match="--tls-cert is given but --tls-key is not"):
        ServerTLS.resolve(certs.cert_file, None)
    other_key = other_ca.parent / "server.key"
    with pytest.raises(TLSConfigError, match="matching key"):
        ServerTLS.resolve(certs.cert_file, other_key)
    with pytest.raises(TLSConfigError, match=r"CA file \(--ca-file\): file .*nope.pem"):
        client_verify(missing)
    with pytest.raises(TLSConfigError, match=r"\$ASTRAFLOW_CA_FILE"):
        os.environ[CA_ENV] = str(missing)
        try:
            SyncDataflowClient("https://127.0.0.1:1", TOKEN)
        finally:
            del os.environ[CA_ENV]
    assert SyncDataflowClient("http://127.0.0.1:1", TOKEN).verify is True  # http ignores TLS


def test_launcher_gives_each_service_its_role_and_files(tmp_path):
    recipe = make_recipe(tmp_path, security={"tls": True, "cert_hosts": ["10.0.0.7"]})
    sec = RunSecurity.prepare(recipe, tmp_path / "run")
    assert stat.S_IMODE((tmp_path / "run" / "run.secret").stat().st_mode) == 0o600
    assert "10.0.0.7" in cert_hosts(sec.tls.cert_file)
    base = {"PATH": "/bin", CA_ENV: "/stale/ca.pem"}
    df, trainer, node = (sec.env(s, base) for s in ("dataflow", "trainer", "node"))
    assert df["ASTRAFLOW_TOKEN"] == sec.secret and CA_ENV not in df
    assert df["ASTRAFLOW_TLS_CERT"] == str(sec.tls.cert_file)
    assert trainer["ASTRAFLOW_TOKEN"] == derive_token(sec.secret, TRAINER)
    assert trainer["ASTRAFLOW_TLS_KEY"] == str(sec.tls.key_file)
    assert trainer[CA_ENV] == str(sec.ca_file) == node[CA_ENV]
    assert node["ASTRAFLOW_TOKEN"] == derive_token(sec.secret, NODE)
    assert "ASTRAFLOW_TLS_CERT" not in node and "ASTRAFLOW_TLS_KEY" not in node
    # a resumed run keeps its secret and certificates (tokens given to remote nodes stay valid)
    again = RunSecurity.prepare(recipe, tmp_path / "run")
    assert again.secret == sec.secret and again.ca_file.read_bytes() == sec.ca_file.read_bytes()
    plain = RunSecurity.prepare(make_recipe(tmp_path), tmp_path / "plain")
    assert plain.tls is None and CA_ENV not in plain.env("node", base)


def test_cli_certs_and_token(tmp_path):
    from astraflow.cli.main import app

    runner = CliRunner()
    out = runner.invoke(app, ["certs", "create", str(tmp_path / "c"), "--host", "10.9.8.7"])
    assert out.exit_code == 0, out.output
    assert "10.9.8.7" in cert_hosts(tmp_path / "c" / "server.pem")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.secret").write_text("s3cret\n")
    out = runner.invoke(app, ["token", "--role", "node", "--run-dir", str(run_dir)])
    assert out.exit_code == 0 and out.output.strip() == derive_token("s3cret", NODE)
    out = runner.invoke(app, ["token", "--role", "trainer"], env={"ASTRAFLOW_TOKEN": "s3cret"})
    assert out.output.strip() == derive_token("s3cret", TRAINER)
    out = runner.invoke(
        app, ["token", "--role", "node"], env={"ASTRAFLOW_TOKEN": derive_token("s", NODE)}
    )
    assert out.exit_code == 1 and "not the run secret" in out.output
    out = runner.invoke(app, ["token", "--role", "root", "--run-dir", str(run_dir)])
    assert out.exit_code == 1 and "--role must be one of node, trainer, admin" in out.output


def _cli(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_serve_names_bad_tls_input(tmp_path, certs, https_service):
    recipe = tmp_path / "r.toml"
    from astraflow.recipe import recipe_to_toml

    recipe.write_text(recipe_to_toml(make_recipe(tmp_path)))
    out = _cli("serve", "dataflow", "--recipe", str(recipe), "--tls-cert",
               str(tmp_path / "missing.pem"), "--tls-key", str(certs.key_file),
               env={"ASTRAFLOW_TOKEN": TOKEN})  # fmt: skip
    assert out.returncode == 1
    assert "--tls-cert" in out.stderr and "missing.pem" in out.stderr, out.stderr
    out = _cli("serve", "dataflow", "--recipe", str(recipe),
               env={"ASTRAFLOW_TOKEN": derive_token(TOKEN, NODE)})  # fmt: skip
    assert out.returncode == 1 and "needs the run secret, got a node token" in out.stderr
    # a node without the run's CA stops at once, saying what to give
    env = {k: v for k, v in os.environ.items() if k != CA_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", "serve", "rollout", "--join", https_service.url],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**env, "COLUMNS": "200", "ASTRAFLOW_TOKEN": derive_token(TOKEN, NODE)},
    )  # fmt: skip
    text = proc.stderr + proc.stdout
    assert proc.returncode == 1 and "certificate verification failed" in text, text
    assert "--ca-file" in text
