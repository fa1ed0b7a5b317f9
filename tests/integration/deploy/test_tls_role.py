"""The roles' TLS tasks, run by ansible-playbook against this machine (no lab needed):
the CA and the host certificate they make are what the programs accept, and a client
trusting that CA verifies the host by the address it listens on."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import ssl
import subprocess
import sys
from pathlib import Path

from lab import PLAYBOOKS

from metaq.common.tls import TlsConfig
from metaq.testing.waiting import run_async


def run_tls_tasks(work: Path) -> subprocess.CompletedProcess[str]:
    settings = {
        "metaq_cluster_name": "role-test",
        "metaq_tls_local_dir": str(work / "control"),
        "metaq_config_dir": str(work / "host"),
        "metaq_listen_host": "127.0.0.1",
        "metaq_user": pwd.getpwuid(os.getuid()).pw_name,
        "metaq_group": grp.getgrgid(os.getgid()).gr_name,
        "metaq_use_systemd": False,
        "ansible_python_interpreter": sys.executable,
    }
    playbook = work / "tls.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "name": "TLS tasks of metaq_common",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": settings,
                    "tasks": [
                        {
                            "name": "Make and install the certificates",
                            "ansible.builtin.include_role": {
                                "name": "metaq_common",
                                "tasks_from": "tls.yml",
                            },
                        }
                    ],
                }
            ]
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    ansible = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run(
        [str(ansible), "-i", "localhost,", str(playbook)],
        capture_output=True, text=True, env=env, cwd=PLAYBOOKS, timeout=180, check=False,
    )  # fmt: skip


async def handshake(server: TlsConfig, client: TlsConfig) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(2))
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server.server_context())
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client.client_context()
        )
        writer.write(b"ok")
        assert await reader.readexactly(2) == b"ok"
        writer.close()


def test_the_role_makes_a_ca_and_a_host_certificate_the_programs_accept(tmp_path: Path) -> None:
    done = run_tls_tasks(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = tmp_path / "host" / "tls"
    assert (installed / "node.key").stat().st_mode & 0o777 == 0o600
    server = TlsConfig(
        str(installed / "node.crt"), str(installed / "node.key"), str(installed / "ca.crt"), True
    )
    # The host's certificate serves, and authenticates the host as a client (mTLS).
    client = TlsConfig(server.cert_file, server.key_file, server.ca_file)
    run_async(handshake(server, client))
    stranger = TlsConfig(ca_file=str(tmp_path / "control" / "ca.crt"))
    try:
        run_async(handshake(server, stranger))
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        pass  # refused: no client certificate
    else:
        raise AssertionError("a client without a certificate was served")
