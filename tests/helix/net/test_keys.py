"""``helix keys``: the files it writes, their permissions, no silent overwrite; loading them back."""

from __future__ import annotations

import os
import stat

import pytest

from helix.cli import main
from helix.core.errors import HelixUserError
from helix.net import keys as keys_mod
from helix.net.control import ControlClient, service_handler, start_server
from helix.net.keys import FILES, TLS_SERVER_NAME, ClusterKeys


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_helix_keys_writes_private_files_and_refuses_to_overwrite(tmp_path, capsys):
    folder = tmp_path / "cluster-keys"
    assert main(["keys", str(folder)]) in (0, None)
    out = capsys.readouterr().out
    assert _mode(folder) == 0o700
    for name in FILES.values():
        assert _mode(folder / name) == 0o600, name
        assert str(folder / name) in out
    assert "--keys" in out and "grpc.crt" in out
    first = ClusterKeys.load(folder)
    assert len(first.curve_server_public) == 40 and first.curve_server_public != first.curve_client_public

    before = {n: (folder / n).read_bytes() for n in FILES.values()}
    assert main(["keys", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0]
    assert {n: (folder / n).read_bytes() for n in FILES.values()} == before   # untouched

    assert main(["keys", str(folder), "--force"]) in (0, None)
    second = ClusterKeys.load(folder)
    assert second.token != first.token and second.curve_client_secret != first.curve_client_secret
    assert all(_mode(folder / n) == 0o600 for n in FILES.values())
    for secret in (first.token, first.curve_server_secret.decode(), first.curve_client_secret.decode()):
        assert secret not in repr(first)   # Ray and logs may print the object


def test_certificate_names_the_cluster(tmp_path):
    from cryptography import x509   # the oracle: a real X.509 parser
    keys_mod.generate(tmp_path / "k")
    cert = x509.load_pem_x509_certificate((tmp_path / "k" / "grpc.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [TLS_SERVER_NAME]


@pytest.mark.parametrize("maker", ["_cryptography_cert", "_openssl_cert"])
def test_either_certificate_maker_serves_grpc_tls(maker, tmp_path):
    import dataclasses
    keys_mod.generate(tmp_path / "k")
    keys = ClusterKeys.load(tmp_path / "k")
    cert, key = getattr(keys_mod, maker)(TLS_SERVER_NAME, 1)
    keys = dataclasses.replace(keys, tls_cert_pem=cert, tls_key_pem=key)
    server = start_server([service_handler("t.Echo", {"Echo": lambda r, _c: r})], keys=keys)
    try:
        assert ControlClient(server.address, "t.Echo", keys=keys).call("Echo", {"x": 1}) == {"x": 1}
    finally:
        server.stop()


def test_load_refuses_what_is_missing_or_readable_by_others(tmp_path):
    folder = tmp_path / "k"
    keys_mod.generate(folder)
    os.chmod(folder / "token", 0o644)
    with pytest.raises(HelixUserError, match="token is readable by others.*chmod 600"):
        ClusterKeys.load(folder)
    os.chmod(folder / "token", 0o600)
    (folder / "data-client.key").unlink()
    with pytest.raises(HelixUserError, match="data-client.key is missing"):
        ClusterKeys.load(folder)
    with pytest.raises(HelixUserError, match="no such folder"):
        ClusterKeys.load(tmp_path / "nowhere")


def test_serve_and_worker_refuse_a_missing_keys_folder(tmp_path, capsys):
    for args in (["serve", "plan.yaml", "--model", str(tmp_path)],
                 ["worker", "--coordinator", "127.0.0.1:1", "--node", "n", "--model", str(tmp_path)]):
        assert main([*args, "--keys", str(tmp_path / "nowhere")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no such folder" in err[0] and "helix keys" in err[0]
