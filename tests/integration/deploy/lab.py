"""Bare-metal hosts for the Ansible deploy test: one network namespace per host (the
chaos suite's :class:`chaoslib.net.Network`), each running its own sshd, and a control
namespace that runs ``ansible-playbook`` against them.

The namespaces share this machine's filesystem, so each host gets its own prefix
(``metaq_root``) for everything the roles install; the kernel is left alone
(``metaq_tune_os: false``) and the services run as root (no user is added to the
machine). Everything made here is removed by :meth:`Lab.destroy`: every process the
lab or the playbooks started is killed by its pid, the namespaces are deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chaoslib.net import Network

from metaq.testing.waiting import deadline, wait_until

PLAYBOOK_TIMEOUT_S: Final = 900.0
"""A playbook's bound: a site.yml that takes 40 s on a quiet lab has taken over 275 s on
a machine running the test suite beside it."""

REPO: Final = Path(__file__).resolve().parents[3]
PLAYBOOKS: Final = REPO / "deploy" / "ansible"
VENV_BIN: Final = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
RESULTS: Final = REPO / "tests" / "results" / "deploy"
"""Where each playbook run's full output stays (git-ignored): the lab's own folder goes
with its teardown, and a failure's summary shows only its last tasks."""
SSHD: Final = "/usr/sbin/sshd"

NAMESERVERS: Final = ("ns1", "ns2", "ns3")
BROKERS: Final = {"a0": ("broker-a", 0), "a1": ("broker-a", 1),
                  "b0": ("broker-b", 0), "b1": ("broker-b", 1)}  # fmt: skip
SCALE_OUT: Final = {"c0": ("broker-c", 0), "c1": ("broker-c", 1)}
CONTROL: Final = "control"
CLIENT: Final = "client"

# Small stores and quick failure detection: seven processes share two cores.
BROKER_SETTINGS: Final = {"idle_poll_us": 0, "replica_lag_max_ms": 2000,
                          "replication_timeout_ms": 2000, "min_in_sync_replicas": 2}  # fmt: skip
STORE_SETTINGS: Final = {"commitlog_segment_bytes": 8388608, "prefault_segments": False,
                         "commitlog_cache_bytes": 16777216, "index_slots": 1000,
                         "index_entries": 4000}  # fmt: skip


def unavailable() -> str:
    """Why the lab cannot be built here, or empty."""
    if os.geteuid() != 0:
        return "the deploy lab needs root (network namespaces, sshd)"
    for tool in ("ip", SSHD, "ssh", "ssh-keygen", "start-stop-daemon"):
        if shutil.which(tool) is None:
            return f"the deploy lab needs {tool} (make ci-deps installs openssh-server)"
    if not (VENV_BIN / "ansible-playbook").exists():
        return "ansible-playbook is not in the venv (make setup)"
    return ""


@dataclass
class Playbook:
    argv: list[str]
    returncode: int
    output: str
    seconds: float
    log: Path | None = None
    """The run's whole output, kept after the lab is gone (:data:`RESULTS`)."""

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP per host: ``{"ns1": {"ok": 12, "changed": 0, ...}}``."""
        hosts: dict[str, dict[str, int]] = {}
        lines = self.output.split("PLAY RECAP", 1)[-1].splitlines()
        for line in lines[1:]:
            name, sep, rest = line.partition(":")
            if not sep or "=" not in rest:
                continue
            hosts[name.strip()] = {k: int(v) for k, v in
                                   (item.split("=") for item in rest.split())}  # fmt: skip
        return hosts

    def changed(self) -> int:
        return sum(h.get("changed", 0) for h in self.recap().values())

    def changed_tasks(self) -> list[str]:
        """``TASK name: changed: [host]`` for every change the run reported."""
        task, found = "", []
        for line in self.output.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.rstrip(" *")
            elif line.startswith("changed:"):
                found.append(f"{task}: {line}")
        return found

    def failure(self) -> str:
        """What to show when the run should have passed: its failures and recap."""
        keep = [line for line in self.output.splitlines()
                if line.startswith(("fatal:", "failed:", "TASK [")) or "=" in line]  # fmt: skip
        where = f"\n(the whole run: {self.log})" if self.log else ""
        return "\n".join(keep[-40:]) + "\n" + self.output[-3000:] + where


@dataclass
class Lab:
    work: Path
    net: Network
    dist: Path
    hosts: list[str]
    sshd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: list[tuple[str, float]] = field(default_factory=list)
    broker_settings: dict[str, object] = field(default_factory=lambda: dict(BROKER_SETTINGS))
    scaled_out: bool = False
    settings: dict[str, object] = field(default_factory=dict)
    """Inventory variables laid over the lab's own (``configure``)."""
    monitoring: tuple[str, ...] = ()
    """The hosts of the inventory's group ``monitoring``."""

    # --- making and unmaking ------------------------------------------------------------

    @classmethod
    def create(cls, work: Path, dist: Path) -> Lab:
        hosts = [*NAMESERVERS, *BROKERS, *SCALE_OUT]
        net = Network.create([CONTROL, *hosts, CLIENT])
        lab = cls(work=work, net=net, dist=dist, hosts=hosts)
        try:
            if not net.namespaces:
                raise RuntimeError(f"no network namespaces: {net.why_loopback}")
            lab._start_sshds()
            lab._write_inventory(scale_out=False)
        except BaseException:
            lab.destroy()
            raise
        return lab

    def _start_sshds(self) -> None:
        ssh = self.work / "ssh"
        ssh.mkdir(parents=True)
        for key in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(ssh / key)], check=True)  # fmt: skip
        shutil.copy(ssh / "id.pub", ssh / "authorized_keys")
        host_key = (ssh / "host_key.pub").read_text().split()
        addresses = ",".join(self.net.address(h) for h in self.hosts)
        (ssh / "known_hosts").write_text(f"{addresses} {host_key[0]} {host_key[1]}\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        for host in self.hosts:
            config = ssh / f"sshd-{host}.conf"
            config.write_text(
                f"ListenAddress {self.net.address(host)}\nPort 22\n"
                f"HostKey {ssh / 'host_key'}\nPidFile {ssh / f'sshd-{host}.pid'}\n"
                f"AuthorizedKeysFile {ssh / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "Subsystem sftp internal-sftp\nMaxSessions 50\nMaxStartups 50\n"
                "LogLevel ERROR\n"
            )
            self.start_sshd(host)
        for host in self.hosts:
            wait_until(lambda h=host: self._ssh_ok(h), 30, f"sshd on {host} answers")

    def start_sshd(self, host: str) -> None:
        config = self.work / "ssh" / f"sshd-{host}.conf"
        with (self.work / f"sshd-{host}.log").open("ab") as log:
            self.sshd[host] = subprocess.Popen(
                self.net.command(host, [SSHD, "-D", "-e", "-f", str(config)]),
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop_sshd(self, host: str) -> None:
        """The host stops answering ssh; what the playbooks started on it goes on."""
        process = self.sshd[host]
        process.kill()
        process.wait(timeout=10)
        # A master connection ansible keeps open (ControlPersist) would still reach it.
        self._close_control_masters()

    def restore_sshd(self, host: str) -> None:
        self.start_sshd(host)
        wait_until(lambda: self._ssh_ok(host), 30, f"sshd on {host} answers again")

    def _ssh_ok(self, host: str) -> bool:
        done = subprocess.run(
            self.net.command(CONTROL, ["ssh", *self.ssh_options(), f"root@{self.net.address(host)}",
                                       "true"]),
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        return done.returncode == 0

    def ssh_options(self) -> list[str]:
        ssh = self.work / "ssh"
        return ["-F", "/dev/null", "-i", str(ssh / "id"), "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={ssh / 'known_hosts'}",
                "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5"]  # fmt: skip

    def destroy(self) -> None:
        """Kill what the playbooks started (their pid files under each host's prefix),
        close ansible's ssh masters, kill the sshds, delete the namespaces; never raises."""
        for pidfile in self.work.glob("hosts/*/run/metaq/*.pid"):
            _kill_pidfile(pidfile)
        self._close_control_masters()
        for process in self.sshd.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        self.net.destroy()

    def _close_control_masters(self) -> None:
        """ansible's ControlPersist masters, which outlive a run by their persist time."""
        for socket in (self.work / "cp").glob("*"):
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={socket}", "lab"],
                           capture_output=True, timeout=10, check=False)  # fmt: skip

    # --- inventory ----------------------------------------------------------------------

    def root(self, host: str) -> Path:
        return self.work / "hosts" / host

    @property
    def admin_secret_file(self) -> Path:
        """The admin user's secret key, generated by the playbooks on first use."""
        return self.work / "admin-secret"

    def client_env(self) -> dict[str, str]:
        """The admin user for clients on the client host (the roles enable auth)."""
        if not self.admin_secret_file.exists():
            return {}
        return {"METAQ_ACCESS_KEY": "admin",
                "METAQ_SECRET_KEY": self.admin_secret_file.read_text().strip()}  # fmt: skip

    def _write_inventory(self, *, scale_out: bool) -> None:
        brokers = {**BROKERS, **(SCALE_OUT if scale_out else {})}
        ssh = self.work / "ssh"
        # Without ssh_options()'s ConnectTimeout: the playbooks' own (ansible.cfg) is what
        # a loaded lab is to be run with.
        common = " ".join(self.ssh_options()[:2] + self.ssh_options()[4:-2])
        inventory = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(ssh / "id"),
                    "ansible_ssh_common_args": common,
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "metaq_create_user": False,
                    "metaq_user": "root",
                    "metaq_group": "root",
                    "metaq_tune_os": False,
                    "metaq_dist_dir": str(self.dist),
                    "metaq_cluster_name": "lab",
                    "metaq_cluster_secret_local_file": str(self.work / "cluster-secret"),
                    "metaq_admin_secret_local_file": str(self.admin_secret_file),
                    "metaq_replication_mode": "sync",
                    # The workload and checks here dial plain; TLS has its own tests.
                    "metaq_tls": False,
                    "metaq_nofile": 65536,
                    "metaq_wait_timeout_s": 90,
                    "metaq_broker_settings": self.broker_settings,
                    "metaq_broker_store_settings": STORE_SETTINGS,
                    **self.settings,
                },
                "children": {
                    "nameservers": {"hosts": {
                        h: {"ansible_host": self.net.address(h), "metaq_root": str(self.root(h))}
                        for h in NAMESERVERS
                    }},
                    "brokers": {"hosts": {
                        h: {"ansible_host": self.net.address(h), "metaq_root": str(self.root(h)),
                            "metaq_broker_group": group, "metaq_broker_id": broker_id,
                            "metaq_broker_role": "master" if broker_id == 0 else "slave",
                            "metaq_room": f"room{broker_id}"}
                        for h, (group, broker_id) in brokers.items()
                    }},
                    **({"monitoring": {"hosts": {h: {} for h in self.monitoring}}}
                       if self.monitoring else {}),
                },
            }
        }  # fmt: skip
        (self.work / "hosts.yml").write_text(json.dumps(inventory, indent=2))

    def scale_out(self) -> None:
        self.scaled_out = True
        self._write_inventory(scale_out=True)

    def configure(self, monitoring: Sequence[str] = (), **settings: object) -> None:
        """Inventory variables for every host (``metaq_tls=True``, ...) and the hosts of
        the group ``monitoring``, before the first run."""
        self.settings.update(settings)
        self.monitoring = tuple(monitoring)
        self._write_inventory(scale_out=self.scaled_out)

    @property
    def tls_ca(self) -> Path | None:
        """The cluster's CA on the control machine, when the lab runs with TLS."""
        if not self.settings.get("metaq_tls"):
            return None
        return Path(str(self.settings["metaq_tls_local_dir"])) / "ca.crt"

    def change_broker_settings(self, **changes: object) -> None:
        """What an operator does to change a broker key: edit the inventory (then site.yml)."""
        self.broker_settings.update(changes)
        self._write_inventory(scale_out=self.scaled_out)

    # --- running things -----------------------------------------------------------------

    def playbook(self, name: str, *args: str, timeout_s: float = PLAYBOOK_TIMEOUT_S) -> Playbook:
        """``ansible-playbook deploy/ansible/<name>`` from the control namespace, killed
        after ``timeout_s`` (scaled by the test deadline setting)."""
        timeout_s = deadline(timeout_s)
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.work / "cp"),
            "ANSIBLE_LOCAL_TEMP": str(self.work / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.work / "hosts.yml"),
                str(PLAYBOOKS / name), *args]  # fmt: skip
        started = time.monotonic()
        lines: list[str] = []
        RESULTS.mkdir(parents=True, exist_ok=True)
        log = RESULTS / f"{name.removesuffix('.yml')}.{int(time.time() * 1000)}.log"
        # Streamed, each line with the seconds since the start: the log shows where a run
        # spends its time, and can be followed while it runs.
        with log.open("w") as out, subprocess.Popen(
            self.net.command(CONTROL, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, cwd=PLAYBOOKS,
        ) as process:  # fmt: skip
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                out.write(f"[{time.monotonic() - started:6.1f}] {line}")
                out.flush()
                if time.monotonic() - started > timeout_s:
                    process.kill()
                    lines.append(f"killed after {timeout_s} s\n")
                    break
        output = "".join(lines)
        self.timings.append((f"{name} {' '.join(args)}".strip(), time.monotonic() - started))
        return Playbook(argv, process.returncode, output, time.monotonic() - started, log)

    def nameserver_addresses(self) -> list[str]:
        return [f"{self.net.address(h)}:9876" for h in NAMESERVERS]

    def client(
        self, argv: Sequence[str], *, timeout_s: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` on the client host (its own namespace), with the repo's venv."""
        return subprocess.run(
            self.net.command(CLIENT, list(argv)), capture_output=True, text=True,
            timeout=timeout_s, check=False, env={**os.environ, **self.client_env(), **(env or {})},
        )  # fmt: skip

    def metaq(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        flags = [f"--nameserver={a}" for a in self.nameserver_addresses()]
        if self.tls_ca is not None:
            flags.append(f"--tls-ca={self.tls_ca}")
        return self.client([str(VENV_BIN / "metaq"), *args, *flags], timeout_s=timeout_s)

    def cluster(self) -> list[dict[str, Any]]:
        done = self.metaq("cluster", "list", "--json")
        assert done.returncode == 0, done.stderr
        brokers: list[dict[str, Any]] = json.loads(done.stdout)["brokers"]
        return brokers


def ansible_env(work: Path) -> dict[str, str]:
    """The environment ansible-playbook runs in for a test: the playbooks' ansible.cfg,
    temporary files under ``work``, no colour."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }


def run_playbook(work: Path, tasks: list[dict[str, Any]], *args: str,
                 **settings: object) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``tasks`` in one play against this machine (no lab), after metaq_common's variables
    are loaded; ``settings`` are the play's variables."""
    playbook = work / "play.yml"
    play = {"name": "metaq_common on this machine", "hosts": "localhost", "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable, **settings},
            "tasks": [{"name": "Load the metaq_common variables",
                       "ansible.builtin.include_role": {"name": "metaq_common",
                                                        "tasks_from": "noop.yml",
                                                        "public": True}},
                      *tasks]}  # fmt: skip
    playbook.write_text(json.dumps([play]))
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), *args],
        capture_output=True, text=True, env=ansible_env(work), cwd=PLAYBOOKS, timeout=120,
        check=False,
    )  # fmt: skip


def _kill_pidfile(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
