"""The one TLS rule every TCP listener shares, through the config loader, ``config check`` and
the hub server's settings; and ``ServerTls``'s reload refusing files it cannot use."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from devtools.pki import make_pki
from edgeagent.api.listeners import ListenerError, Listeners
from edgeagent.cli import main
from edgeagent.config import parse_config
from edgeagent.hub.server.settings import ServerSettings as HubSettings
from edgeagent.sections import ConfigError
from edgeagent.tls import ServerTls, TlsError, TlsSettings

PLAIN = "would carry tokens and data in clear"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\ntcp_host = '0.0.0.0'\ntoken = 't'\n", "[server] tls"),
        ("[server]\ntcp_host = '10.1.2.3'\ntoken = 't'\n", "[server] tls"),
        ("[server]\ntoken = 't'\n[grpc]\nenabled = true\nhost = '0.0.0.0'\n", "[grpc] tls"),
    ],
)
def test_a_non_loopback_plain_listener_is_refused(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert f"{key}: plain TCP on the non-loopback address" in str(caught.value)
    assert PLAIN in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "",  # loopback TCP and the Unix socket
        "[server]\ntcp_host = '::1'\n",
        "[server]\ntcp_host = '0.0.0.0'\ntoken = 't'\ntls = 'off'\n",
        "[server]\ntcp_host = '0.0.0.0'\ntcp_port = 0\n",  # no TCP listener at all
        "[server]\ntoken = 't'\n[grpc]\nenabled = true\nhost = '0.0.0.0'\ntls = 'off'\n",
        "[server]\ntoken = 't'\n[grpc]\nenabled = true\nhost = '0.0.0.0'\nport = 0\n",
    ],
)
def test_loopback_sockets_and_an_explicit_off_are_accepted(text: str) -> None:
    parse_config(text)


def test_a_certificate_makes_every_listener_tls(pki) -> None:
    config = parse_config(
        "[server]\ntcp_host = '0.0.0.0'\ntoken = 't'\n[grpc]\nenabled = true\nhost = '::'\n"
        f"[tls]\ncert_file = '{pki.server_cert}'\nkey_file = '{pki.server_key}'\n"
    )
    assert config.tls.enabled and config.server.tls == config.grpc.tls == "auto"


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("cert_file = '{cert}'\n", "[tls] key_file: cert_file and key_file go together"),
        ("key_file = '{key}'\n", "[tls] cert_file: cert_file and key_file go together"),
        ("client_ca_file = '{ca}'\n", "[tls] client_ca_file: needs cert_file and key_file"),
        ("cert_file = '{cert}.gone'\nkey_file = '{key}'\n", "[tls] cert_file: "),
        ("tls = 'on'\n", "[tls] unknown key(s) tls"),
    ],
)
def test_bad_tls_tables_name_the_key(pki, lines: str, message: str) -> None:
    table = lines.format(cert=pki.server_cert, key=pki.server_key, ca=pki.ca)
    with pytest.raises(ConfigError) as caught:
        parse_config("[tls]\n" + table)
    assert message in str(caught.value)


def test_config_check_refuses_a_plain_lan_listener(tmp_path: Path, capsys) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\ntcp_host = '192.168.1.20'\ntoken = 't'\n")
    assert main(["config", "check", str(config)]) != 0
    assert "[server] tls: plain TCP" in capsys.readouterr().err
    config.write_text("[server]\ntcp_host = '192.168.1.20'\ntoken = 't'\ntls = 'off'\n")
    assert main(["config", "check", str(config)]) == 0


def test_the_hub_server_takes_the_same_rule_by_its_flags(pki, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    lan = HubSettings(database_url="sqlite:///x", host="0.0.0.0", token_file=tokens)
    with pytest.raises(ValueError, match="--tls off"):
        lan.validate()
    HubSettings(
        database_url="sqlite:///x", host="0.0.0.0", token_file=tokens, tls_mode="off"
    ).validate()
    HubSettings(
        database_url="sqlite:///x",
        host="0.0.0.0",
        token_file=tokens,
        tls=TlsSettings(pki.server_cert, pki.server_key),
    ).validate()
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        HubSettings(database_url="sqlite:///x", tls=TlsSettings(pki.server_cert)).validate()


def test_the_served_context_is_tls_1_2_or_newer_and_asks_for_client_certificates(pki) -> None:
    plain = ServerTls(TlsSettings(pki.server_cert, pki.server_key))
    assert plain.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert plain.context.verify_mode == ssl.CERT_NONE and not plain.mutual
    mutual = ServerTls(TlsSettings(pki.server_cert, pki.server_key, pki.ca))
    assert mutual.context.verify_mode == ssl.CERT_REQUIRED and mutual.mutual


def test_mismatched_files_are_refused_at_start_and_on_reload(pki, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other", "another CA")
    with pytest.raises(TlsError, match="with key"):
        ServerTls(TlsSettings(pki.server_cert, other.server_key))
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    served = ServerTls(TlsSettings(cert, key))
    key.write_bytes(other.server_key.read_bytes())  # a half-finished renewal
    assert not served.reload()
    assert served.snapshot() == (0, served.pem) and served.pem.cert == cert.read_bytes()
    cert.write_bytes(other.server_cert.read_bytes())
    assert served.reload()
    generation, pem = served.snapshot()
    assert generation == 1 and pem.cert == other.server_cert.read_bytes()


def test_config_check_and_the_listeners_refuse_a_key_that_is_not_the_certificates(
    pki, tmp_path: Path, capsys
) -> None:
    other = make_pki(tmp_path / "other", "another CA")
    config = tmp_path / "agent.toml"
    config.write_text(f"[tls]\ncert_file = '{pki.server_cert}'\nkey_file = '{other.server_key}'\n")
    assert main(["config", "check", str(config)]) != 0
    assert "[tls] TLS certificate" in capsys.readouterr().err
    listeners = Listeners(TlsSettings(pki.server_cert, other.server_key))
    with pytest.raises(ListenerError, match=r"with key .*\(\[tls\] cert_file"):
        listeners.server_tls("auto")
    assert listeners.server_tls("off") is None  # a listener with tls = "off" reads no file
