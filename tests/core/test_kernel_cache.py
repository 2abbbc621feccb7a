"""numba's cache of the kernels is dropped when any kernel source changed, not only the kernel's own file:
kernels inline functions of other modules, and a cached aggregate kernel kept an old ``apply_group``
(wrong results, or a crash) after an update that changed only ``accumulators.py``."""

from sparkcep.core.kernel_cache import SOURCES, drop_stale


def test_a_change_to_any_kernel_source_drops_the_caches_made_from_the_old_ones(tmp_path):
    core, cache = tmp_path / "core", tmp_path / "core" / "__pycache__"
    cache.mkdir(parents=True)
    sources = [core / "aggregate.py", core / "accumulators.py"]
    for path in sources:
        path.write_text(f"# {path.stem}\n")

    def cached():
        for name in ("aggregate.accumulate_time-36.py311.nbi", "aggregate.accumulate_time-36.py311.1.nbc",
                     "other.kernel-1.py311.nbi"):
            (cache / name).write_bytes(b"")
        return sorted(p.name for p in cache.glob("*.nb[ic]"))

    cached()
    assert drop_stale(sources)  # no digest yet: made from sources it cannot vouch for
    assert sorted(p.name for p in cache.glob("*.nb[ic]")) == ["other.kernel-1.py311.nbi"]  # not a kernel source's
    kept = cached()
    assert not drop_stale(sources)
    assert sorted(p.name for p in cache.glob("*.nb[ic]")) == kept
    sources[1].write_text("# accumulators, changed\n")  # the inlined module only
    assert drop_stale(sources)
    assert sorted(p.name for p in cache.glob("*.nb[ic]")) == ["other.kernel-1.py311.nbi"]


def test_every_module_with_kernels_is_a_source():
    names = {f"{p.parent.name}/{p.name}" for p in SOURCES}
    for path in SOURCES[0].parents[1].rglob("*.py"):
        if "@njit" in path.read_text() or "@intrinsic" in path.read_text():
            assert f"{path.parent.name}/{path.name}" in names, path
