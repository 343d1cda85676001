"""The JIT monitor: what a serving process does when a FlyDSL kernel it needs is not in the kernel
cache, and the message naming the call, the kernel, what the cache holds instead and the fix.

Settings, read from the environment once per process, at the first call of any public entry
(the first `aiter.dispatch` report installs the monitor; `import aiter` stays light):

- `AITER_JIT=allow` (default): a miss compiles, as FlyDSL does, silently.
- `AITER_JIT=warn`: it compiles, and the message is logged once per kernel (function and
  compile-time parameters) on the logger "aiter.jit" at WARNING.
- `AITER_JIT=error`: JitCompileRefused (a RuntimeError) carries the message; nothing compiles.
- `FLYDSL_RUNTIME_RUN_ONLY=1`: FlyDSL refuses every miss itself; JitCompileRefused with the
  same message replaces FlyDSL's error (which stays chained as its cause).
- `AITER_AOT_FALLBACK=1`: every entry serves a call whose kernel the cache lacks with an
  equivalent variant it holds, logged once (`aiter.ops.gemm.plan.Plan.launch`,
  `aiter.ops.conv3d.entry`, `aiter.ops.moe.entry`, `aiter.ops.fmha_fp8.entry`); when none is cached, the policy
  above decides.

The monitor acts on kernels defined in aiter only, and not at all in the AOT builder's processes
(`bridge.in_aot_build`), where compiling is the point. It subscribes to dispatch records, and
watches FlyDSL through `aiter.flydsl_bridge`, only when warn, error or run-only is in force;
with the defaults, the first report uninstalls the installer and later reports build nothing.

Adding a fallback to a new family: list the variants its kernels document as computing the
same result (same inputs and outputs, another blocking of the reduction), in the order to try
them. At launch, when `settings().fallback` is on, pass the planned choice, the variants and a
function launching one of them to `cached_equivalent` (it names kernels, compiling and running
nothing, remembers the answer and logs a fallback once), and report the record of the kernel
actually used. gemm_plan.Plan.launch is the worked example.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from aiter import dispatch
from aiter import flydsl_bridge as bridge
from aiter.tuning import CONFIG_DIR_ENV, find_spec, row_name

if TYPE_CHECKING:
    from aiter.flydsl_bridge.manifest import KernelEntry

ENV_JIT = "AITER_JIT"
ENV_FALLBACK = "AITER_AOT_FALLBACK"
ALLOW, WARN, ERROR = "allow", "warn", "error"
POLICIES = (ALLOW, WARN, ERROR)
LOGGER_NAME = "aiter.jit"
NEAREST_SHOWN = 3  # cached entries a message lists
UNTUNED = "untuned shape, heuristic"
ABSENT = "(absent)"  # a parameter one side does not have

log = logging.getLogger(LOGGER_NAME)
T = TypeVar("T")


class JitCompileRefused(RuntimeError):
    """A FlyDSL kernel the cache does not hold was not compiled (AITER_JIT=error, or
    FLYDSL_RUNTIME_RUN_ONLY=1); the message names the call, the kernel and the fix."""

    def __init__(self, message: str, request: bridge.KernelRequest | None = None) -> None:
        super().__init__(message)
        self.request = request


@dataclass(frozen=True)
class Settings:
    policy: str = ALLOW  # one of POLICIES
    fallback: bool = False  # AITER_AOT_FALLBACK=1
    run_only: bool = False  # FLYDSL_RUNTIME_RUN_ONLY on

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from `environ` (default os.environ); ValueError names a bad variable."""
        env = os.environ if environ is None else environ
        policy = env.get(ENV_JIT, "").strip().lower() or ALLOW
        if policy not in POLICIES:
            raise ValueError(
                f"{ENV_JIT}={env[ENV_JIT]!r}: expected one of {', '.join(POLICIES)} "
                f"(default {ALLOW})"
            )
        fallback = env.get(ENV_FALLBACK, "").strip() or "0"
        if fallback not in ("0", "1"):
            raise ValueError(
                f"{ENV_FALLBACK}={env[ENV_FALLBACK]!r}: expected 1 (on) or 0 (off, the default)"
            )
        return cls(policy, fallback == "1", bridge.run_only_from_env(env))

    @property
    def listens(self) -> bool:
        """Whether a miss needs a message: only then are records built and FlyDSL watched."""
        return self.policy != ALLOW or self.run_only


# --- what a message says ---


@dataclass(frozen=True)
class CachedEntry:
    """One entry of the cache, as the nearest-entry list shows it."""

    path: str  # relative to the cache root: <function>_<manager key>/<file>.pkl
    params: tuple[tuple[str, str], ...] | None  # None: the AOT manifest does not list it
    built_for: str = ""  # the table row and axis range that asked for it at build time


@dataclass(frozen=True)
class Nearest:
    entry: CachedEntry
    differs: tuple[tuple[str, str, str], ...]  # (parameter, this call's value, the entry's)


def parse_params(text: str) -> tuple[tuple[str, str], ...]:
    """`KernelRequest.describe_params()` text ("a=bfloat16 tile_m=32 ...") back to pairs."""
    pairs = []
    for part in re.split(r" (?=[A-Za-z_]\w*=)", text.strip()):
        name, sep, value = part.partition("=")
        if sep:
            pairs.append((name, value))
    return tuple(pairs)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _distance(differs: Iterable[tuple[str, str, str]]) -> float:
    """How far apart differing values are: a factor of two in a size counts 1, any other
    difference (a dtype, a flag, a missing parameter) counts 1."""
    total = 0.0
    for _, wanted, cached in differs:
        a, b = _number(wanted), _number(cached)
        total += abs(math.log2(a / b)) if a and b and a > 0 and b > 0 else 1.0
    return total


def rank_nearest(
    wanted: Sequence[tuple[str, str]], entries: Iterable[CachedEntry]
) -> list[Nearest]:
    """`entries` by how little their parameters differ from `wanted`: fewest differing
    parameters first, then smallest distance (see _distance), then path; entries whose
    parameters are unknown come last."""
    mine = dict(wanted)
    known, unknown = [], []
    for entry in entries:
        if entry.params is None:
            unknown.append(Nearest(entry, ()))
            continue
        theirs = dict(entry.params)
        names = [*mine, *(n for n in theirs if n not in mine)]
        differs = tuple(
            (n, mine.get(n, ABSENT), theirs.get(n, ABSENT))
            for n in names
            if mine.get(n) != theirs.get(n)
        )
        known.append(Nearest(entry, differs))
    known.sort(key=lambda n: (len(n.differs), _distance(n.differs), n.entry.path))
    unknown.sort(key=lambda n: n.entry.path)
    return known + unknown


@dataclass(frozen=True)
class Miss:
    """Everything a miss message says; `describe_miss` gathers it, `format_miss` writes it."""

    headline: str
    request: bridge.KernelRequest
    record: dispatch.DispatchRecord | None  # the last record of this thread
    arch: str
    cu_num: str
    cache_root: str  # "" when FlyDSL's disk cache is off
    entries: int  # entries of the function in this kernel's cache directory
    nearest: tuple[Nearest, ...]
    elsewhere: int  # entries of the function under other manager keys
    fix: str


def _served(record: dispatch.DispatchRecord) -> str:
    how = f"row {record.row}" if record.row else UNTUNED
    params = " ".join(f"{k}={v}" for k, v in record.params.items())
    kernel = " ".join(p for p in (record.kernel or record.backend, params) if p)
    return f"{how} -> {kernel}"


def _nearest_line(n: Nearest) -> str:
    entry = n.entry
    head = f"    {entry.path}" + (f" (built for {entry.built_for})" if entry.built_for else "")
    if entry.params is None:
        return f"{head}: parameters unknown (not in the AOT manifest)"
    if not n.differs:
        return f"{head}: same parameters"
    diffs = ", ".join(
        f"{name}={cached} (this call: {wanted})" for name, wanted, cached in n.differs
    )
    return f"{head}: {diffs}"


def format_miss(miss: Miss) -> str:
    """The message: headline, then one labelled line per fact, then the fix."""
    r, rec = miss.request, miss.record
    if rec is None:
        call = "unknown: no aiter entry reported a call in this thread before this launch"
        served = "unknown"
    else:
        call = f"{rec.op}({', '.join(f'{k}={v}' for k, v in rec.args.items())})"
        served = _served(rec)
    lines = [
        miss.headline,
        f"  call:    {call}",
        f"  device:  {miss.arch}, {miss.cu_num} CUs",
        f"  served:  {served}",
        f"  kernel:  {r.function} [{r.describe_params() or 'no compile-time parameters'}]",
    ]
    if not miss.cache_root:
        lines.append(
            "  cache:   FlyDSL's disk cache is off (FLYDSL_RUNTIME_ENABLE_CACHE=0 or an empty "
            f"{bridge.ENV_CACHE_DIR}): nothing can be served from it"
        )
    else:
        if r.key:
            lines.append(f"  entry:   {r.path} (absent)")
        elsewhere = (
            f"; {miss.elsewhere} more under other manager keys (another kernel source, FlyDSL "
            "version or arch)"
            if miss.elsewhere
            else ""
        )
        if miss.entries:
            shown = min(miss.entries, NEAREST_SHOWN)
            held = f"{miss.entries} other entr{'y' if miss.entries == 1 else 'ies'}"
            lines.append(
                f"  cache:   {miss.cache_root} holds {held} of {r.function} for this kernel "
                f"source and arch{elsewhere}; nearest {shown}:"
            )
            lines.extend(_nearest_line(n) for n in miss.nearest[:shown])
        else:
            lines.append(
                f"  cache:   {miss.cache_root} holds no entry of {r.function} for this kernel "
                f"source and arch{elsewhere}"
            )
    lines.append(f"  fix:     {miss.fix}")
    return "\n".join(lines)


def _built_for(entry: KernelEntry) -> str:
    """The first job that asked for `entry` at build time: its row and axis range."""
    if not entry.requested_by:
        return ""
    first = entry.requested_by[0]
    text = Path(first.row).name
    if first.axis:
        text += f", {first.axis} {first.lo}-{first.hi}"
    if len(entry.requested_by) > 1:
        text += f", and {len(entry.requested_by) - 1} more"
    return text


def cached_entries(request: bridge.KernelRequest) -> tuple[list[CachedEntry], int]:
    """The other entries of `request`'s function in its cache directory (parameters from the
    AOT manifest at the cache root where it lists them), and how many entries of the function
    sit under other manager keys."""
    from aiter.flydsl_bridge import manifest

    if not request.cache_dir:
        return [], 0
    kernel_dir = Path(request.cache_dir)
    root = kernel_dir.parent
    try:
        every = manifest.read(root).entries()
    except (OSError, ValueError):
        every = {}
    listed = {rel: e for rel, e in every.items() if rel.split("/", 1)[0] == kernel_dir.name}
    own = f"{kernel_dir.name}/{request.file_name}" if request.key else None
    entries = []
    for path in sorted(kernel_dir.glob("*.pkl")) if kernel_dir.is_dir() else []:
        rel = f"{kernel_dir.name}/{path.name}"
        if rel == own:
            continue
        entry = listed.get(rel)
        if entry is None:
            entries.append(CachedEntry(rel, None))
        else:
            entries.append(CachedEntry(rel, parse_params(entry.params), _built_for(entry)))
    sibling = re.compile(re.escape(request.function) + r"_[0-9a-f]+")
    elsewhere = 0
    if root.is_dir():
        for directory in root.iterdir():
            if directory != kernel_dir and sibling.fullmatch(directory.name):
                elsewhere += sum(1 for _ in directory.glob("*.pkl"))
    return entries, elsewhere


def _listed(cache: str, arch: str) -> dict[str, KernelEntry]:
    """The entries the manifest of the cache at `cache` lists for `arch`."""
    from aiter.flydsl_bridge import manifest

    try:
        return manifest.read(Path(cache)).entries(arch)
    except (OSError, ValueError):
        return {}


def replayed_ranges(cache: str, arch: str, row: str) -> dict[str, list[tuple[int, int]]]:
    """The ranges of each axis over which the build of the cache at `cache` replayed `row` for
    `arch` (from its manifest; a grid's fixed values as one-value ranges); empty when no build
    of it replayed that row."""
    wanted, ranges = row_name(row), {}
    for entry in _listed(cache, arch).values():
        for requester in entry.requested_by:
            if row_name(requester.row) != wanted:
                continue
            ranges.setdefault(requester.axis, []).append((requester.lo, requester.hi))
            for axis, value in requester.fixed.items():
                ranges.setdefault(axis, []).append((value, value))
    return {axis: sorted(set(spans)) for axis, spans in ranges.items()}


def _spans(spans: list[tuple[int, int]]) -> str:
    """Ranges as text, touching ones merged: "1-64, 128"."""
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return ", ".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in merged)


def _gap_hint(
    record: dispatch.DispatchRecord,
    ranges: dict[str, list[tuple[int, int]]],
    request: bridge.KernelRequest | None,
    listed: Mapping[str, KernelEntry],
    rebuild: str,
) -> str:
    """The fix when the cache's build replayed the call's row (`listed`: the entries its
    manifest lists): rebuild when the entry was built and is gone, or when the call lies outside
    the ranges it replayed (a maximum left them out); else no rebuild helps, and the message
    names the gap."""
    entry = f"{Path(request.cache_dir).name}/{request.file_name}" if request and request.key else ""
    if entry in listed:
        return f"the build of this cache wrote this entry and it is gone: {rebuild}"
    for axis, value in record.axis.items():
        spans = ranges.get(axis)
        if spans and not any(lo <= value <= hi for lo, hi in spans):
            return (
                f"the build of this cache replayed row {record.row} at {axis} {_spans(spans)}, "
                f"and this call's {axis} is {value}: rebuild with --max-{axis.lower()} {value} "
                f"or more: {rebuild}"
            )
    at = ", ".join(f"{axis}={v}" for axis, v in record.axis.items()) or "this call"
    replayed = "; ".join(f"{axis} {_spans(spans)}" for axis, spans in sorted(ranges.items()))
    kernel = f"{request.function} [{request.describe_params()}]" if request else "this kernel"
    return (
        f"a rebuild cannot help: the build of this cache replayed row {record.row} "
        f"({replayed}) and never asked for {kernel} at {at}; the replay does not reach this "
        "call as the runtime makes it (a gap of the AOT module, to report). Until it is "
        f"closed, serve with {ENV_FALLBACK}=1 (an equivalent cached kernel, where one exists) "
        f"or let it compile ({ENV_JIT}=warn, without {bridge.ENV_RUN_ONLY})"
    )


def fix_hint(
    record: dispatch.DispatchRecord | None,
    arch: str,
    cu_num: str,
    cache: str,
    request: bridge.KernelRequest | None = None,
) -> str:
    """How to get the kernel into the cache: the table to add a row to and the build command;
    or, when the cache's own build replayed the row and still lacks the kernel, that a rebuild
    cannot help, and where the replay falls short."""
    target = f"GPU_ARCHS={arch}:{cu_num} " if arch != "unknown" else ""
    cache_arg = f" --cache-dir {cache}" if cache else ""
    spec = find_spec(record.table) if record is not None and record.table else None
    if spec is None:
        return (
            "build the cache for this operator and serve from it: "
            f"{target}python -m aiter.aot.flydsl{cache_arg}"
        )
    module = f" --module {spec.aot_module}" if spec.aot_module else ""
    config_dir = os.environ.get(CONFIG_DIR_ENV)
    tables = f"{CONFIG_DIR_ENV}={config_dir} " if config_dir else ""  # the build reads the same
    build = f"{target}{tables}python -m aiter.aot.flydsl{module}"
    if record.row is None and record.table_row and spec.covers is not None:
        # A table of shapes the runtime never looks up: the row meant to cover the call.
        covering = next((r for r in spec.load().rows if spec.covers(r, record.table_row)), None)
        if covering is not None:
            record = dataclasses.replace(record, row=f"{covering.source}:{covering.line}")
    if record.row is None:
        example = ""
        if record.table_row:
            cells = ",".join(record.table_row.get(column, "") for column in spec.header)
            example = f", e.g. {cells}"
        return (
            f"add a row for this shape to {spec.name}{example} (--csv {spec.short_name}=PATH) "
            f"and rebuild: {build} --csv {spec.short_name}=PATH{cache_arg}"
        )
    row_file = record.row.rsplit(":", 1)[0]
    csv = "" if row_file == str(spec.default_path) else f" --csv {spec.short_name}={row_file}"
    ranges = replayed_ranges(cache, arch, record.row) if cache else {}
    if ranges:
        listed = _listed(cache, arch)
        return _gap_hint(record, ranges, request, listed, f"{build}{csv}{cache_arg}")
    axis = spec.axis.name
    return (
        f"the row is in {row_file}: rebuild the cache with it: {build}{csv}{cache_arg} "
        f"(a build replays {axis} up to --max-{axis.lower()}; raise it if this call's {axis} is "
        "above)"
    )


def _device() -> tuple[str, str]:
    from aiter import device

    try:
        return device.arch(), str(device.cu_num())
    except Exception:  # no GPU to ask: the message still names everything else
        return "unknown", "unknown"


REASON_ERROR = f"{ENV_JIT}=error refuses to compile it"
REASON_RUN_ONLY = f"{bridge.ENV_RUN_ONLY}=1 forbids compiling it"
REASON_WARN = f"{ENV_JIT}=warn: compiling it now, on the serving path (logged once per kernel)"


def describe_miss(
    request: bridge.KernelRequest, record: dispatch.DispatchRecord | None, reason: str
) -> Miss:
    """Gather what the message says about a miss of `request` (reading the cache directory)."""
    arch, cu_num = _device()
    op = record.op if record is not None else "a FlyDSL launch"
    headline = f"{op}: FlyDSL kernel {request.function} is not in the kernel cache; {reason}"
    entries, elsewhere = cached_entries(request)
    root = str(Path(request.cache_dir).parent) if request.cache_dir else ""
    return Miss(
        headline=headline,
        request=request,
        record=record,
        arch=arch,
        cu_num=cu_num,
        cache_root=root,
        entries=len(entries),
        nearest=tuple(rank_nearest(request.params, entries)),
        elsewhere=elsewhere,
        fix=fix_hint(record, arch, cu_num, root, request),
    )


# --- the monitor ---


def _ours(request: bridge.KernelRequest) -> bool:
    return request.module == "aiter" or request.module.startswith("aiter.")


class _Monitor:
    """Keeps the last dispatch record of each thread and answers the serving hooks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._local = threading.local()
        self._lock = threading.Lock()
        self._warned: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def observe(self, record: dispatch.DispatchRecord) -> None:
        self._local.record = record

    def last_record(self) -> dispatch.DispatchRecord | None:
        return getattr(self._local, "record", None)

    def compiling(self, request: bridge.KernelRequest) -> None:
        policy = self.settings.policy
        if policy == ALLOW or not _ours(request):
            return
        if policy == ERROR:
            miss = describe_miss(request, self.last_record(), REASON_ERROR)
            raise JitCompileRefused(format_miss(miss), request)
        with self._lock:
            if (request.function, request.params) in self._warned:
                return
            self._warned.add((request.function, request.params))
        log.warning("%s", format_miss(describe_miss(request, self.last_record(), REASON_WARN)))

    def run_only_miss(
        self, request: bridge.KernelRequest, error: RuntimeError
    ) -> BaseException | None:
        if not _ours(request):
            return None
        miss = describe_miss(request, self.last_record(), REASON_RUN_ONLY)
        return JitCompileRefused(format_miss(miss), request)


_lock = threading.RLock()
_settings: Settings | None = None
_monitor: _Monitor | None = None
_fallbacks_noted: set[tuple[str, str, str]] = set()
_variants_chosen: dict[Hashable, object] = {}  # see cached_equivalent
_UNKNOWN = object()


def settings() -> Settings:
    """The settings in force, installing the monitor from the environment on first use."""
    current = _settings
    return current if current is not None else install()


def install(chosen: Settings | None = None) -> Settings:
    """Install the monitor with `chosen` settings (default: from the environment; ValueError
    names a bad variable). Replaces an earlier installation; inert in the AOT builder."""
    global _settings, _monitor
    with _lock:
        if bridge.in_aot_build():
            chosen = Settings()
        elif chosen is None:
            chosen = Settings.from_env()
        _stop()
        if chosen.listens:
            _monitor = _Monitor(chosen)
            bridge.watch_compiles(_monitor)
            dispatch.subscribe(_monitor.observe)
        dispatch.unsubscribe(first_report)
        _settings = chosen
        return chosen


def uninstall() -> None:
    """Stop listening and forget the settings: the next report installs the monitor anew."""
    global _settings
    with _lock:
        _stop()
        _settings = None
        dispatch.subscribe(first_report)


def _stop() -> None:
    global _monitor
    if _monitor is not None:
        dispatch.unsubscribe(_monitor.observe)
        bridge.watch_compiles(None)
        _monitor = None


def last_record() -> dispatch.DispatchRecord | None:
    """The last record reported in this thread, which a miss message describes (None when the
    monitor is not listening)."""
    monitor = _monitor
    return monitor.last_record() if monitor is not None else None


def first_report(record: dispatch.DispatchRecord) -> None:
    """Called with the first record of the process (subscribed when this module is imported):
    install, then hand the record on, since the report that brought it started before the
    monitor subscribed."""
    settings()
    monitor = _monitor
    if monitor is not None:
        monitor.observe(record)


# --- what fallbacks use ---


def kernels_cached(launch: Callable[[], object]) -> bool:
    """Whether the cache holds every FlyDSL kernel `launch()` launches. The launches are only
    named (bridge.name_launches): nothing compiles or runs, and what they return is None. A
    kernel whose disk cache is off counts as held: there is nothing to fall back from."""
    with bridge.name_launches() as named:
        launch()
    return all(request.exists() or not request.cache_dir for request in named)


def cached_equivalent(
    op: str,
    signature: Hashable,
    planned: T,
    variants: Sequence[T],
    launch: Callable[[T], object],
    describe: Callable[[T], str],
    differs: str = "the K sum blocked differently",
) -> T:
    """`planned` when the cache holds the kernels `launch(planned)` launches, else the first of
    `variants` whose kernels it holds (logged once with note_fallback; `differs` says how the
    kernels differ), else `planned` (the JIT policy then decides). Names kernels only: nothing
    compiles or runs. A variant `launch` refuses (ValueError or NotImplementedError: the call's
    shape rules it out) is skipped.

    Naming costs about a millisecond: the answer is remembered per `op`, `signature` (what
    besides the choices selects the kernels: arch, dtypes, flags, ...) and the descriptions of
    `planned` and `variants`.
    """
    memo_key = (op, signature, tuple(describe(c) for c in (planned, *variants)))
    with _lock:
        chosen = _variants_chosen.get(memo_key, _UNKNOWN)
    if chosen is _UNKNOWN:
        chosen = planned
        if not kernels_cached(lambda: launch(planned)):
            for variant in variants:
                try:
                    if kernels_cached(lambda v=variant: launch(v)):
                        chosen = variant
                        break
                except (ValueError, NotImplementedError):
                    continue
        with _lock:
            _variants_chosen[memo_key] = chosen
    if chosen != planned:
        note_fallback(op, describe(planned), describe(chosen), differs)
    return chosen  # type: ignore[return-value]


def note_fallback(
    op: str, planned: str, used: str, differs: str = "the K sum blocked differently"
) -> None:
    """Log, once per (op, planned, used), that a call was served by a cached equivalent;
    `differs` says how the two kernels differ."""
    with _lock:
        if (op, planned, used) in _fallbacks_noted:
            return
        _fallbacks_noted.add((op, planned, used))
    log.warning(
        "%s: kernel %s is not in the kernel cache; serving it with the cached equivalent %s "
        "instead (%s=1: the same result, %s)",
        op,
        planned,
        used,
        ENV_FALLBACK,
        differs,
    )


# The first report of the process installs the monitor; dispatch itself imports nothing of it.
dispatch.subscribe(first_report)
