"""The corpus successor table behind prompt lookup's fallback."""

import numpy as np

from mlxspec.drafting.lookup import ngram_table
from mlxspec.drafting.lookup.ngram_table import successor_table


def test_successor_table_takes_the_most_frequent_then_smallest_successor():
    sequences = [[0, 1, 0, 1, 0, 2], [2, 3, 2, 1], [3, 0]]
    # 0 -> 1 twice, 2 once; 1 -> 0 twice; 2 -> 3 once, 1 once (tie: smaller id 1); 3 -> 2, 0 (tie: 0); 4 unseen
    assert successor_table(sequences, 5).tolist() == [1, 0, 1, 0, -1]
    assert successor_table([[4]], 5).tolist() == [-1] * 5


def test_corpus_successors_are_built_once_then_read_from_the_cache(tmp_path, monkeypatch, tiny_dirs):
    import mlxspec
    from mlxspec.drafting.lookup import corpus

    spec = mlxspec.load(tiny_dirs["target"], draft=None)
    files = []
    for i, text in enumerate(["abcabcab", "acac", "bbb"]):
        path = tmp_path / f"f{i}.py"
        path.write_text(text)
        files.append(path)
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "split_files", lambda root=None: (files, []))
    table = ngram_table.corpus_successors(spec.tokenizer, 8)
    a, b, c = (spec.tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "abc")
    # pairs: a->b 3, a->c 2; b->c 2, b->b 2 (tie: the smaller id, b); c->a 3
    assert (table[a], table[b], table[c]) == (b, b, a)
    cached = list((tmp_path / "cache").glob("successors-*.npy"))
    assert len(cached) == 1
    monkeypatch.setattr(corpus, "split_files", lambda root=None: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert np.array_equal(ngram_table.corpus_successors(spec.tokenizer, 8), table)
