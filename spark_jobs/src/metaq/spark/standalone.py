"""A Spark standalone cluster (one master, one worker) from the pyspark installation, on
loopback with work directories of its own: what the cluster test and ``make spark-demo
SPARK_MASTER=standalone`` run jobs on. Processes are stopped by their pid.

``python -m metaq.spark.standalone <work-dir>`` starts one and prints its master URL; it
stops on Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from metaq.spark.home import INSTALLED, linked_home

_MASTER_URL: Final = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED: Final = re.compile(r"Successfully registered with master")


def spark_env(work_dir: Path) -> dict[str, str]:
    """Environment for Spark's scripts and JVMs: this installation (through
    :func:`~metaq.spark.home.linked_home`, so Python workers import its compiled pyspark),
    loopback, logs and work files under ``work_dir``, executors' Python = this
    interpreter."""
    return {
        **os.environ,
        "SPARK_HOME": str(linked_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work_dir / "logs"),
        "SPARK_WORKER_DIR": str(work_dir / "worker"),
        "SPARK_LOCAL_DIRS": str(work_dir / "local"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


@dataclass
class StandaloneCluster:
    work_dir: Path
    master_url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, work_dir: Path, *, cores: int = 2, timeout_s: float = 60.0) -> StandaloneCluster:
        work_dir.mkdir(parents=True, exist_ok=True)
        cluster = cls(work_dir)
        try:
            master_log = cluster._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
            )  # fmt: skip
            cluster.master_url = cluster._wait(master_log, _MASTER_URL, timeout_s).group(1)
            worker_log = cluster._spawn(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                "--host", "127.0.0.1", "--webui-port", "0", "--cores", str(cores),
                "--memory", "2g", "--work-dir", str(work_dir / "worker"),
            )  # fmt: skip
            cluster._wait(worker_log, _REGISTERED, timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def submit(self, script: Path, *args: str, timeout_s: float = 300.0) -> str:
        """``spark-submit`` the Python ``script`` to this cluster; its output, or
        CalledProcessError with it."""
        command = [
            str(INSTALLED / "bin" / "spark-submit"),
            "--master", self.master_url,
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.executor.memory=1g",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", f"spark.pyspark.python={sys.executable}",
            str(script), *args,
        ]  # fmt: skip
        done = subprocess.run(
            command,
            env=spark_env(self.work_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
        output = done.stdout.decode(errors="replace")
        if done.returncode:
            raise subprocess.CalledProcessError(done.returncode, command, output)
        return output

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _spawn(self, name: str, main_class: str, *args: str) -> Path:
        log = self.work_dir / f"{name}.log"
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [str(INSTALLED / "bin" / "spark-class"), main_class, *args],
                    env=spark_env(self.work_dir),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        return log

    def _wait(self, log: Path, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = pattern.search(log.read_text(errors="replace"))
            if found:
                return found
            if any(p.poll() is not None for p in self.processes) or time.monotonic() > deadline:
                raise RuntimeError(f"Spark {log.stem} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)  # poll interval of a deadline-bound wait for a log line


def main() -> int:
    work_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "run-data/spark-standalone")
    cluster = StandaloneCluster.start(work_dir)
    print(cluster.master_url, flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
