"""A full cache disk is never fatal: the entry is given up, the compilers carry
on in a private temporary cache, the warmup succeeds, and the report, GetStatus and
`warmgate_compile_cache_degraded` say the cache is degraded. `.trash/` stays bounded.

The filesystem is a real 1 MiB tmpfs (mounted here, as root); the test skips where mounting
is not permitted.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tmpfs_helpers import mounted_tmpfs
from warmgate.client import cache_fs
from warmgate.server.api.convert import compile_cache_to_proto
from warmgate.server.cache import CACHE_ENV_VARS, CompileCache
from warmgate.server.cache.degrade import PROBE_BYTES, forget_vec_isa
from warmgate.server.cache.session import run_plan_with_cache
from warmgate.server.cache.trash import bound_trash
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.core.failures import describe_failure
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.server.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {"schema": 1, "model": {"hidden_size": 64}, "versions": {"torch": "2.13"}}
TMPFS_BYTES = 1 << 20
# A compiled artefact bigger than what the tmpfs can hold.
ARTEFACT_BYTES = 2 * TMPFS_BYTES


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", TMPFS_BYTES) as mount:
        yield mount


def fill_up(directory: Path) -> None:
    """Write into `directory` until its filesystem has no space left."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


class CompilingPlan:
    """Stands in for the warmup plan: each run compiles one artefact into TRITON_CACHE_DIR,
    as Triton does, and a failed write fails the phase the way the compilers report it."""

    def __init__(self, environ: dict[str, str], failure: Callable[[OSError], Exception]
                 ) -> None:
        self.environ = environ
        self.failure = failure
        self.written: list[Path] = []

    def __call__(self) -> WarmupReport:
        target = Path(self.environ["TRITON_CACHE_DIR"]) / "kernel.so"
        try:
            target.write_bytes(b"\1" * ARTEFACT_BYTES)
            self.written.append(target)
            phase = PhaseResult(name="kernels.prefill", status=PhaseStatus.RAN)
        except OSError as exc:
            phase = PhaseResult(name="kernels.prefill", status=PhaseStatus.FAILED,
                                detail=describe_failure("kernels.prefill", self.failure(exc)))
        outcome = (WarmupOutcome.SUCCEEDED if phase.status is PhaseStatus.RAN
                   else WarmupOutcome.FAILED)
        return WarmupReport(outcome, [phase], 0.1, "hash")


class CppCompileError(RuntimeError):
    """Named like inductor's: with a little space left the compiler fails without an errno."""


FAILURES = {
    "enospc": lambda exc: exc,
    "compiler-error-without-errno": lambda exc: CppCompileError("C++ compile error: ld: "
                                                                "final link failed"),
}


@pytest.mark.parametrize("failure", list(FAILURES), ids=list(FAILURES))
def test_full_disk_mid_warmup_degrades_and_warmup_succeeds(small_fs: Path,
                                                           failure: str) -> None:
    env: dict[str, str] = {}
    cache = CompileCache(small_fs, environ=env)
    assert cache.open(RunnerConfig(), inputs=INPUTS).state == "miss" and cache.filling
    entry = cache.entry
    assert entry is not None and env["TRITON_CACHE_DIR"].startswith(str(entry))
    plan = CompilingPlan(env, FAILURES[failure])

    report = run_plan_with_cache(cache, plan)

    assert report.succeeded, report
    info = cache.info.to_dict()
    assert info["degraded"] and info["state"] == "miss", info
    assert "kernels.prefill" in info["detail"]
    assert not cache.filling  # the fill lock is free: the next opener rebuilds the entry
    # The compilers moved off the full disk, into a private directory that took the write.
    assert all(not env[var].startswith(str(small_fs)) for var in CACHE_ENV_VARS)
    assert plan.written and plan.written[0].is_file()
    # The half-written entry gave its space back; nothing is READY.
    assert not entry.exists()
    assert not any((small_fs / cache_fs.TRASH_DIR).glob("*"))
    assert report.compile_cache is not None and report.compile_cache["degraded"]
    assert compile_cache_to_proto(report.compile_cache).degraded
    metrics = Metrics()
    metrics.observe_report(report)
    assert metrics.registry.get_sample_value("warmgate_compile_cache_degraded") == 1.0
    cache.close()


def test_ready_marker_that_cannot_be_written_degrades(small_fs: Path) -> None:
    env: dict[str, str] = {}
    cache = CompileCache(small_fs, environ=env)
    cache.open(RunnerConfig(), inputs=INPUTS)
    assert cache.entry is not None
    fill_up(small_fs)  # another pod fills the volume before our commit
    cache.commit(1.0)
    assert cache.info.degraded and not cache.filling
    assert "READY" in cache.info.detail
    assert not any(p.name == "READY" for p in small_fs.rglob("READY"))
    cache.close()


def test_healthy_cache_failure_is_not_blamed_on_the_cache(tmp_path: Path) -> None:
    """A real compile error on a disk with room stays a failed warmup: no retry, no
    degraded cache, no silent fallback."""
    env: dict[str, str] = {}
    cache = CompileCache(tmp_path, environ=env)
    cache.open(RunnerConfig(), inputs=INPUTS)
    runs: list[int] = []

    def failing_plan() -> WarmupReport:
        runs.append(1)
        phase = PhaseResult(name="compile", status=PhaseStatus.FAILED,
                            detail=describe_failure("compile", CppCompileError("syntax")))
        return WarmupReport(WarmupOutcome.FAILED, [phase], 0.1, "hash")

    report = run_plan_with_cache(cache, failing_plan)
    assert not report.succeeded and len(runs) == 1
    assert not cache.info.degraded and report.compile_cache is not None
    assert not report.compile_cache["degraded"]
    cache.close()


def test_probe_size_fits_the_artefacts() -> None:
    assert PROBE_BYTES <= TMPFS_BYTES < ARTEFACT_BYTES


def test_full_cache_disk_at_start_warmup_only_succeeds_degraded(small_fs: Path) -> None:
    """The process: --warmup-only on a cache volume with no space left exits 0 and says so."""
    fill_up(small_fs)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WARMGATE_") and k not in CACHE_ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    done = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--warmup-only", "--json", "--device",
         "cpu", "--cache-dir", str(small_fs / "cache")],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["compile_cache"]["degraded"] is True, report["compile_cache"]
    assert report["compile_cache"]["state"] == "error"
    degraded_lines = [line for line in done.stderr.splitlines() if "degraded" in line]
    assert len(degraded_lines) == 1, done.stderr



# The fewest compile buckets the warmup accepts (1 and 2 tokens): the first bucket's link is
# what meets the full disk, and each further bucket only adds its compile twice (the given-up
# run and the rerun in the private cache).
FEWEST_BUCKETS = ["--max-num-seqs", "1", "--max-num-batched-tokens", "2"]


@pytest.mark.slow
def test_compile_warmup_only_on_a_nearly_full_cache_volume_succeeds_degraded(
        small_fs: Path) -> None:
    """The process: `--compile --warmup-only` where inductor's C++ sources fit but the
    libraries it links do not (16 pages left) ends SUCCEEDED, degraded, not FAILED with the
    link's "No space left on device"."""
    leave_free(small_fs, 16)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WARMGATE_") and k not in CACHE_ENV_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    done = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--warmup-only", "--json", "--device",
         "cpu", "--compile", *FEWEST_BUCKETS, "--cache-dir", str(small_fs / "cache")],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["outcome"] == "WARMUP_OUTCOME_SUCCEEDED", report
    assert report["compile_cache"]["degraded"] is True, report["compile_cache"]
FREE_PAGES = 3
PAGE_BYTES = 4096


def leave_free(directory: Path, pages: int) -> None:
    """Fill `directory`'s filesystem, then give `pages` pages back."""
    fill_up(directory)
    filler = directory / "filler"
    os.truncate(filler, max(0, filler.stat().st_size - pages * PAGE_BYTES))


@pytest.fixture
def compilers_environ() -> Iterator[None]:
    """The compilers' cache variables of this process, as the test found them, afterwards:
    inductor reads os.environ, so the cache under test points the real ones."""
    saved = {var: os.environ.get(var) for var in CACHE_ENV_VARS}
    for var in CACHE_ENV_VARS:
        os.environ.pop(var, None)
    yield
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


class LinkingPlan:
    """Stands in for the compile phase: inductor's C++ code cache compiles and links a
    library into TORCHINDUCTOR_CACHE_DIR, as a compiled model's kernels are."""

    def __init__(self) -> None:
        # A source of its own: the code cache is per process and keyed by the source.
        self.source = f'// {uuid.uuid4()}\nextern "C" int answer() {{ return 42; }}\n'
        self.failures: list[str] = []

    def __call__(self) -> WarmupReport:
        from torch._inductor.codecache import CppCodeCache

        try:
            assert CppCodeCache.load(self.source).answer() == 42
            phase = PhaseResult(name="compile", status=PhaseStatus.RAN)
        except Exception as exc:  # what the phase runner does with a phase's exception
            self.failures.append(str(exc))
            phase = PhaseResult(name="compile", status=PhaseStatus.FAILED,
                                detail=describe_failure("compile", exc))
        outcome = (WarmupOutcome.SUCCEEDED if phase.status is PhaseStatus.RAN
                   else WarmupOutcome.FAILED)
        return WarmupReport(outcome, [phase], 0.1, "hash")


def test_a_cpp_link_that_hit_the_full_disk_links_again_in_the_private_cache(
        small_fs: Path, compilers_environ: None) -> None:
    """`--compile --warmup-only` on a 1 MB cache volume: inductor's link ran out of space,
    the cache degraded, and the second run re-raised the same link error. inductor keeps a
    loader per source bound to the library path in the given-up directory (and a failed
    build's error); the degrade must make it build again in the private cache."""
    cache = CompileCache(small_fs, environ=os.environ)
    assert cache.open(RunnerConfig(), inputs=INPUTS).state == "miss"
    leave_free(small_fs, FREE_PAGES)
    plan = LinkingPlan()

    report = run_plan_with_cache(cache, plan)

    assert len(plan.failures) == 1 and "No space left on device" in plan.failures[0], \
        plan.failures
    assert report.succeeded, report.phases
    assert cache.info.degraded
    assert not os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(small_fs))
    cache.close()


def test_the_vector_isa_probed_on_a_full_volume_is_probed_again_in_the_private_cache(
        small_fs: Path, compilers_environ: None) -> None:
    """Inductor decides once which vector ISA its C++ kernels use, by building a probe in its
    cache directory. On the full volume that build fails and "none" was kept after the
    degrade: the next test process's compiles of cached vector kernels then failed
    ('at::vec' has not been declared)."""
    machine = subprocess.run(
        [sys.executable, "-c", "from torch._inductor.cpu_vec_isa import pick_vec_isa; "
                               "isa = pick_vec_isa(); print(bool(isa), type(isa).__name__)"],
        capture_output=True, text=True, check=True).stdout.split()
    if machine[0] != "True":
        pytest.skip("this machine's CPU has no vector ISA inductor uses")
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    # Importing inductor points TORCHINDUCTOR_CACHE_DIR at its default where the process had
    # not imported it yet (torch 2.13); the cache must find the variable unset, as in a server.
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cache = CompileCache(small_fs, environ=os.environ)
    assert cache.open(RunnerConfig(), inputs=INPUTS).state == "miss"
    assert not cache.env.respected
    leave_free(small_fs, FREE_PAGES)
    # Every answer this process cached (an earlier compile in this worker probed already), so
    # the next probe runs on the full volume.
    forget_vec_isa()
    assert not pick_vec_isa()  # the probe could not build on the full volume

    report = run_plan_with_cache(cache, LinkingPlan())

    assert report.succeeded and cache.info.degraded
    # The machine's own ISA, not a lesser one some ISA class's cached "no" left behind.
    assert type(pick_vec_isa()).__name__ == machine[1], \
        "the ISA answer from the full volume outlived the degrade"
    cache.close()


def _trash_entry(root: Path, name: str, moved_at: int, size: int) -> Path:
    path = root / cache_fs.TRASH_DIR / f"{name}.{moved_at}.1.1"
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"\0" * size)
    return path


def test_trash_keeps_the_newest_entries_within_the_byte_bound(tmp_path: Path) -> None:
    old = _trash_entry(tmp_path, "a", 100, 10)
    mid = _trash_entry(tmp_path, "b", 200, 10)
    new = _trash_entry(tmp_path, "c", 300, 10)
    removed = bound_trash(tmp_path, keep=2, max_bytes=1000)
    assert removed == [old] and mid.exists() and new.exists()
    removed = bound_trash(tmp_path, keep=2, max_bytes=15)
    assert removed == [mid] and new.exists()


def test_rebuild_bounds_the_trash(tmp_path: Path) -> None:
    """Each rebuild moves a damaged entry aside; the trash never holds more than the bound."""
    for round_ in range(4):
        cache = CompileCache(tmp_path, environ={})
        cache.open(RunnerConfig(), inputs=INPUTS)
        assert cache.entry is not None
        (cache.entry / "inductor" / "graph.bin").write_bytes(b"x" * 64)
        cache.close()  # no READY: the next opener rebuilds
        assert len(list((tmp_path / cache_fs.TRASH_DIR).glob("*"))) == min(round_, 2)


class Stopped(BaseException):
    """Like the controller's WarmupCancelled: not an Exception, so no phase catches it."""


def test_stopped_warmup_releases_the_fill_lock(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path, environ={})
    cache.open(RunnerConfig(), inputs=INPUTS)
    assert cache.filling

    def stopped_plan() -> WarmupReport:
        raise Stopped()

    with pytest.raises(Stopped):
        run_plan_with_cache(cache, stopped_plan)
    assert not cache.filling and not cache.info.degraded
    # Another process (here: another opener) can fill the entry at once.
    other = CompileCache(tmp_path, lock_timeout_s=0.5, environ={})
    assert other.open(RunnerConfig(), inputs=INPUTS).state == "rebuilt"
    other.close()
    cache.close()
