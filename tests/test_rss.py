"""grow.rss: a process's peak resident memory between a reset and a read (Linux's VmHWM), and every
rank's peak as growth records; nothing where /proc is missing."""

from __future__ import annotations

import mmap
import re
import sys

import pytest

from grow import rss


def resident_mb() -> float:
    return int(re.search(r"^VmRSS:\s+(\d+)", (rss.PROC / "status").read_text(), re.MULTILINE).group(1)) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_peak_covers_a_freed_allocation_until_it_is_reset():
    assert rss.reset_peak()
    before = resident_mb()
    pages = mmap.mmap(-1, 200 * 2**20)  # 200 MB of fresh pages (a malloc may reuse resident freed heap), each touched
    for i in range(0, len(pages), mmap.PAGESIZE):
        pages[i] = 1
    pages.close()
    high = rss.peak_mb()
    assert high >= before + 190, (before, high)
    assert rss.reset_peak()
    assert rss.peak_mb() < high - 150  # the freed pages are not the new peak


def test_without_proc_nothing_is_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(rss, "PROC", tmp_path / "missing")
    assert rss.reset_peak() is False and rss.peak_mb() is None
    assert rss.peaks_by_rank(None) == {}


def test_one_process_records_its_own_peak_as_rank_0():
    assert rss.peaks_by_rank(12.5) == {"growth/peak_rss_mb/rank0": 12.5}
