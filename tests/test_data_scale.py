"""A 300 MB jsonl corpus through `grow train data=hf` in bounded memory (scripts/data_scale.py; slow:
several minutes on 2 cores). Memory is asserted, never time: docs/data.md reports the timings."""

import importlib.util

import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("data_scale", ROOT / "scripts" / "data_scale.py")
data_scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(data_scale)

LIMIT_MB = 1536  # 1.5 GB


@pytest.mark.slow
def test_a_300_mb_corpus_trains_in_bounded_memory_and_the_second_start_reuses_the_cache(tmp_path):
    r = data_scale.measure(300, tmp_path)
    first = r["first_run"]
    assert r["text_mb"] > 250  # the whole corpus was tokenized (its text, without the json)
    assert first["main_rss_mb"] <= LIMIT_MB and first["tree_pss_mb"] <= LIMIT_MB, first
    assert r["second_reused_the_cache"] and not r["second_tokenized"]
    assert r["second_run"]["first_step_s"] is not None


def test_the_corpus_writer_is_deterministic(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    data_scale.write_corpus(a, 1)
    data_scale.write_corpus(b, 1)
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size >= 1e6
