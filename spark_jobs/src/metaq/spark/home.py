"""The SPARK_HOME that jobs, tests and benchmarks run a pip-installed pyspark with.

Spark starts a fresh Python process for each planning step of a Python data source
(creating the source, planning a read and pushing filters into it, a stream's source
runner, a write and its commit) and puts ``$SPARK_HOME/python/lib/pyspark.zip`` ahead of
site-packages on that process's ``PYTHONPATH``. Python caches no bytecode for modules it
imports from a zip, so each of those processes compiles pyspark from source before it
connects back to the JVM: 1.1-1.3 CPU seconds, against 0.3-0.4 for the installed pyspark's
compiled bytecode. Spark 4.3 waits a fixed 10 s for the connection (no setting changes
it), which a host running a dozen processes per core misses: "Python worker failed to
connect back" (docs/spark.md, troubleshooting).

:func:`use_installed_pyspark` points ``SPARK_HOME`` at a directory holding only links to
the installation's ``bin`` and ``jars``, so Spark finds no zip to put first and its Python
processes import the installed pyspark. A ``SPARK_HOME`` already set (a Spark
installation of its own) is left as it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

import pyspark

INSTALLED: Final = Path(pyspark.__file__).parent
"""The pip-installed pyspark: Spark's scripts in ``bin``, its jars in ``jars``."""
_LINKED: Final = ("bin", "jars")


def use_installed_pyspark() -> Path:
    """Set ``SPARK_HOME`` (unless it is set) to a home whose Python processes import the
    installed pyspark, made on first use under the temporary directory; return the home
    in use. Call it before the first SparkSession of the process."""
    given = os.environ.get("SPARK_HOME")
    if given:
        return Path(given)
    home = linked_home()
    os.environ["SPARK_HOME"] = str(home)
    return home


def linked_home() -> Path:
    """The directory of links to :data:`INSTALLED`'s ``bin`` and ``jars``, one per user and
    installation, made atomically (several processes may start at once)."""
    tag = hashlib.blake2b(str(INSTALLED).encode(), digest_size=6).hexdigest()
    home = Path(tempfile.gettempdir()) / f"metaq-spark-home-{os.getuid()}-{tag}"
    if home.is_dir():
        return home
    draft = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    for name in _LINKED:
        (draft / name).symlink_to(INSTALLED / name, target_is_directory=True)
    try:
        draft.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(draft)
    return home
