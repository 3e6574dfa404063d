"""Which code trained a run: summary.json's ``code`` entry and the report's "Code:" line."""

from __future__ import annotations

import subprocess

from grow.provenance import CHECKOUT, code_version, describe
from grow.report.tables import code_lines


def test_the_code_version_is_this_checkouts_commit():
    """In a git checkout (CI's clean clone) the commit is HEAD's and ``dirty`` says whether tracked files
    changed; outside one (an unpacked sdist) both are null."""
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True)
    code = code_version()
    if head.returncode == 0 and (CHECKOUT / ".git").exists():
        assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)
    else:
        assert code["commit"] is None and code["dirty"] is None
    assert code["version"] and code["torch"]


def test_describe_and_the_reports_code_line():
    clean = {"version": "0.1.0", "commit": "2dd7727abcdef", "dirty": False, "torch": "2.13.0"}
    assert describe(clean) == "grow 0.1.0 at 2dd7727 (torch 2.13.0)"
    assert describe({**clean, "dirty": True}) == "grow 0.1.0 at 2dd7727 + uncommitted changes (torch 2.13.0)"
    assert describe({**clean, "commit": None}) == "grow 0.1.0 (torch 2.13.0)"
    assert describe(None) == "not recorded"
    assert code_lines([describe(clean)]) == ["Code: grow 0.1.0 at 2dd7727 (torch 2.13.0).", ""]
    two = code_lines([describe(clean), describe(None)])[0]
    assert two.startswith("Code: the runs come from 2 versions (grow 0.1.0 at 2dd7727 (torch 2.13.0); not recorded)")
    assert code_lines([]) == []


def test_the_machine_entry_and_the_reports_machine_line():
    from grow.provenance import describe_machine, machine

    m = machine()
    assert m["cpu"]["model"] and m["cpu"]["arch"] and ("gpu" in m)
    cpu = {"model": "AMD EPYC", "simd": "avx2", "fma": True, "torch_capability": "AVX2", "arch": "x86_64"}
    assert describe_machine({"cpu": cpu, "gpu": None}) == "AMD EPYC (avx2, torch AVX2)"
    assert describe_machine({"cpu": cpu, "gpu": "NVIDIA H200"}) == "NVIDIA H200 on AMD EPYC (avx2, torch AVX2)"
    assert describe_machine(None) == "not recorded"
    one = code_lines(["grow 0.1.0 (torch 2.13.0)"], ["AMD EPYC (avx2, torch AVX2)"])
    assert one == ["Code: grow 0.1.0 (torch 2.13.0).", "", "Machine: AMD EPYC (avx2, torch AVX2).", ""]
    two = code_lines([], ["AMD EPYC (avx2, torch AVX2)", "Intel Xeon (avx512f, torch AVX512)"])
    assert two[0].startswith("Machines: the runs come from 2 (AMD EPYC (avx2, torch AVX2); Intel Xeon")
