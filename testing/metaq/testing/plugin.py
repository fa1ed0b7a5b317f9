"""The pytest plugin (the ``pytest11`` entry point of metaq-testing): fixtures that start
real processes and stop them when the test ends, whatever happened in it."""

from __future__ import annotations
