"""Every ``RINGTREE_*`` environment variable, declared once: name, parser, default, meaning.

Like NCCL's ``NCCL_PARAM`` and mpi4py's ``rc``: a variable is one :func:`declare` line
here, and nothing else in the package reads it from the environment. :func:`load` parses
every declared variable into a frozen :class:`Settings` (a communicator builds one when it
is made and passes it down); a value that does not parse is an error naming the variable,
never a silent default; an unknown ``RINGTREE_`` name is warned about once, with the
closest declared name. ``ringtree env`` prints the table of ``docs/environment.md``, and
a test keeps the two equal (and finds any ``RINGTREE_`` name the package uses without
declaring it).

Scopes: ``tuning`` knobs change how ringtree runs; ``job`` variables say who a process
is in its job (read by :mod:`ringtree.bootstrap.job`, written by the launchers); ``tools``
belong to one command.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "RINGTREE_"


@dataclass(frozen=True)
class Var:
    """One environment variable: ``parse`` turns its (stripped, non-empty) text into a
    value; unset or empty means ``default``."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    scope: str = "tuning"

    @property
    def attr(self) -> str:
        """The :class:`Settings` attribute: ``RINGTREE_SHM_SLOTS`` → ``shm_slots``."""
        return self.name[len(PREFIX):].lower()


VARS: dict[str, Var] = {}


def declare(name: str, parse: Callable[[str], Any], default: Any, doc: str,
            scope: str = "tuning") -> Var:
    if not name.startswith(PREFIX) or name in VARS:
        raise ValueError(f"{name}: not a new {PREFIX}* name")
    VARS[name] = var = Var(name, parse, default, doc, scope)
    return var


# ---- parsers --------------------------------------------------------------------------------

def number(text: str) -> float:
    return float(text)


def integer(text: str) -> int:
    """An integer, in any base Python writes (``4194304``, ``0x400000``, ``1_048_576``)."""
    return int(text, 0)


def whole(text: str) -> int:
    """A number truncated to an integer (``4`` or ``4.0``)."""
    return int(float(text))


MIN_TIMEOUT = 1e-3


def as_timeout(value: object, what: str = "timeout") -> float:
    """A deadline in seconds: a real number of at least :data:`MIN_TIMEOUT`, or ``math.inf``.

    Anything else (``-1``, ``0``, ``nan``, ``1e-9``, ``'5'``, ``True``) raises before any
    rank sends a byte, so a bad value never times out on one rank only.
    """
    if type(value) is float and value >= MIN_TIMEOUT:  # (NaN fails it) the ABC check
        return value                                     # below costs ~1-2 µs a call
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds (int or float), "
                        f"got {type(value).__name__} {value!r}")
    t = float(value)
    if math.isnan(t) or t < MIN_TIMEOUT:
        raise ValueError(f"{what} must be at least {MIN_TIMEOUT:g} s (or math.inf), "
                         f"got {value!r}")
    return t


def seconds(text: str) -> float:
    return as_timeout(float(text), "the value")


def text(value: str) -> str:
    return value


def upper(value: str) -> str:
    return value.upper()


def flag(value: str) -> bool:
    low = value.lower()
    if low in ("1", "on", "yes", "true"):
        return True
    if low in ("0", "off", "no", "false"):
        return False
    raise ValueError("expected 1/on/yes/true or 0/off/no/false")


class Choice:
    """A parser for one word of ``options`` (any case). The list may grow after it is
    declared: ``RINGTREE_TRANSPORT``'s words are ``auto`` and the registered transports'
    (:mod:`ringtree.transports.registry` keeps :data:`TRANSPORTS` up to date)."""

    def __init__(self, *options: str) -> None:
        self.options = list(options)

    def __call__(self, value: str) -> str:
        low = value.lower()
        if low not in self.options:
            raise ValueError(f"expected one of {', '.join(self.options)}")
        return low


def choice(*options: str) -> Choice:
    return Choice(*options)


# ---- the variables ------------------------------------------------------------------------

declare("RINGTREE_TIMEOUT", seconds, 300.0, "seconds before a collective fails")
declare("RINGTREE_INIT_TIMEOUT", seconds, None,
        "seconds the ranks wait for each other at rendezvous (default: RINGTREE_TIMEOUT)")
TRANSPORTS = choice("auto")  # + every registered transport's name
declare("RINGTREE_TRANSPORT", TRANSPORTS, "auto",
        "`auto`: shared memory between ranks on one host, TCP across; `shm`; `tcp`")
declare("RINGTREE_SOCKET_IFNAME", text, None,
        "interfaces to listen on (`eth0`, `^docker,lo`, `=ib0`: NCCL_SOCKET_IFNAME syntax)")
declare("RINGTREE_NSOCKS_PERTHREAD", integer, 1,
        "TCP sockets per peer and thread (NCCL_NSOCKS_PERTHREAD); messages from 256 KiB "
        "stripe")
declare("RINGTREE_SOCKET_NTHREADS", integer, 1,
        "multiplies RINGTREE_NSOCKS_PERTHREAD into the sockets per peer, as "
        "NCCL_SOCKET_NTHREADS does (1-16; the rank's one poll loop drives them all)")
declare("RINGTREE_SOCKET_BUFFER", integer, None,
        "bytes of TCP socket buffer to ask for where the kernel allows it (4 MiB; 0: "
        "autotuning only)")
declare("RINGTREE_SOCKET_CC", text, "cubic",
        "TCP congestion control of ringtree's sockets where the kernel offers it "
        "(`kernel`: the kernel's default)")
declare("RINGTREE_BUFFSIZE", integer, 4 << 20,
        "pipeline buffer in bytes; slices are a quarter of it (at least 4 KiB)")
declare("RINGTREE_NCHANNELS", integer, 1, "parallel channels per collective")
declare("RINGTREE_ALGO", text, "",
        "algorithms to use: NCCL_ALGO syntax, e.g. `ring;allreduce:^tree`")
declare("RINGTREE_TUNE", choice("online", "model"), "online",
        "`online`: across hosts, time the cost model's close candidates on the "
        "communicator once per (collective, size) and keep the fastest; on one host, "
        "time the single-copy all-reduce against the segment's split once per octave "
        "of bytes where hosts disagree (1-16 MiB on 2 ranks, 4-64 MiB on more); "
        "`model`: the model and the fixed crossovers alone")
declare("RINGTREE_DEBUG", upper, "", "`INFO` prints each rank's first collectives and algorithms")
declare("RINGTREE_SHM_SLOTS", whole, 4, "shared-memory slots per ring")
declare("RINGTREE_SHM_YIELD_US", number, 0.0,
        "µs of `sched_yield` polling before sleeping on the shm doorbell")
declare("RINGTREE_SHM_SPIN_US", number, None,
        "µs to spin before sleeping (default 50, 0 when a host's ranks outnumber its cores)")
declare("RINGTREE_SHM_DIRECT_MIN", whole, None,
        "bytes from which shm reads straight from the sender's memory (0 = never; default "
        "1 MiB when a host's ranks outnumber its cores, else 0)")
declare("RINGTREE_STORE_OP_TIMEOUT", number, None,
        "seconds one store request may take (default 60)")
declare("RINGTREE_CHECK_NET", flag, True,
        "at init, check that ranks on different hosts reach each other (0 = off)")
declare("RINGTREE_CHECK_NET_TIMEOUT", number, None,
        "seconds each cross-host reachability probe waits")
declare("RINGTREE_TOPO_FILE", text, None,
        "a file describing the hosts' links, used instead of measuring them at init")
declare("RINGTREE_COLLNET_ENABLE", flag, False,
        "run the collnet_* algorithms on an in-network aggregation switch")
declare("RINGTREE_COLLNET_SWITCH", text, None, "the switch's ADDR:PORT")
declare("RINGTREE_COLLNET_TOKEN", text, None,
        "the token the switch admits this job with (default: RINGTREE_TOKEN)")
declare("RINGTREE_COLLNET_HOP_US", number, None,
        "the switch's hop time in µs for the tuner (default: measured)")
declare("RINGTREE_PROTO", text, "",
        "protocols to use: NCCL_PROTO syntax, e.g. `LL`, `^LL`, `Simple;allreduce:LL`")
declare("RINGTREE_LL_CELL", integer, None,
        "LL cell bytes per rank and parity: the largest LL contribution (default 1 MiB up "
        "to 8 ranks, else 64 KiB)")
declare("RINGTREE_LL_SPIN_US", number, None,
        "µs an LL wait spins before yielding (default 5, 0 when a host's ranks outnumber "
        "its cores)")
declare("RINGTREE_LL_YIELD_US", number, 2000.0,
        "µs an LL wait polls with `sched_yield` before sleeping on its doorbell")
declare("RINGTREE_LL_ASYNC_US", number, 500.0,
        "µs an async LL call waits at most for a thread to wait on it before the LL thread "
        "takes it (0 = the LL thread is woken at every async call)")
declare("RINGTREE_LL_NATIVE", flag, True,
        "run LL's publish, wait and fold in the compiled kernel where the package built it "
        "(0 = the same steps in Python, the same bits)")
declare("RINGTREE_LL_STORES", choice("measure", "stream", "cache"), "measure",
        "how LL's compiled rounds copy into the segment from 4 KiB: `stream` (non-temporal "
        "stores), `cache` (through the caches), `measure`: both timed on the communicator "
        "at its first LL call of 4 KiB or more, the faster kept (`stream` with "
        "`RINGTREE_TUNE=model`)")
declare("RINGTREE_CMA", flag, True,
        "single-copy all-reduce, all-gather, reduce-scatter and broadcast between a host's "
        "ranks: "
        "peers read each other's buffers with `process_vm_readv` where a probe at "
        "communicator creation finds it allowed (0 = the shared segment's paths)")
declare("RINGTREE_CMA_MIN", integer, None,
        "bytes (the larger buffer) from which all-reduce, all-gather, reduce-scatter and "
        "broadcast read peers' buffers directly (default: the measured crossovers, see "
        "ll_direct.py and ll_direct_fold.py)")
declare("RINGTREE_CMA_SHARE", flag, True,
        "large single-copy all-gathers and broadcasts share their copies: pieces drawn "
        "from shared counters, an early rank writing its input into a late one's output, "
        "a broadcast's root into its readers' (`process_vm_writev`); 0 = every rank reads "
        "its own blocks")
declare("RINGTREE_MSCCL_ALGOS", text, None,
        "a folder of MSCCL-IR files, searched after `MSCCL_ALGO_DIR`'s: a call that names "
        "no algorithm runs the first file that fits it, as MSCCL's executors choose; "
        "`algo=\"msccl:NAME\"` runs NAME.xml")
declare("RINGTREE_PROFILE", text, None,
        "directory for per-rank profiler events (then `ringtree trace DIR`)")
declare("RINGTREE_PROFILE_EVENTS", integer, 1 << 20, "profiler events kept per communicator")
declare("RINGTREE_PROFILE_CLOCK", choice("auto", "pingpong"), "auto",
        "`pingpong` always measures clock offsets between ranks, even on one host")
declare("RINGTREE_FR_BUFFER_SIZE", integer, 1024, "flight recorder entries (0 = off)")
declare("RINGTREE_FR_DUMP_DIR", text, None,
        "flight recorder dumps (default: RINGTREE_PROFILE, else a per-job temp directory)")
declare("RINGTREE_FR_KEEP", integer, 10, "flight recorder dump directories kept per user")
declare("RINGTREE_FR_KEEP_DAYS", number, 7.0, "days a flight recorder dump directory is kept")
declare("RINGTREE_DOCTOR", flag, True, "the hang doctor's watcher thread (0 = off)")
declare("RINGTREE_DOCTOR_POLL", number, 0.5, "seconds between the watcher's store polls")
declare("RINGTREE_DOCTOR_WAIT", number, 2.0, "seconds a diagnosis waits for peers' reports")

declare("RINGTREE_RANK", integer, None, "this process's rank", "job")
declare("RINGTREE_WORLD_SIZE", integer, None, "number of ranks", "job")
declare("RINGTREE_LOCAL_RANK", integer, None, "rank among the ranks on this host", "job")
declare("RINGTREE_LOCAL_WORLD_SIZE", integer, None, "ranks on this host", "job")
declare("RINGTREE_NODE_RANK", integer, None, "this host's index in the job", "job")
declare("RINGTREE_MASTER_ADDR", text, None, "host of the rendezvous store", "job")
declare("RINGTREE_MASTER_PORT", integer, None, "port of the rendezvous store", "job")
declare("RINGTREE_TOKEN", text, None,
        "shared secret of the job's store (`ringtree run` exports a random one)", "job")
declare("RINGTREE_STORE_EXTERNAL", flag, False,
        "the launcher hosts the store (rank 0 must not)", "job")
declare("RINGTREE_JOIN", flag, False,
        "a replacement: `ringtree.init` takes a dead rank's seat in the running job", "job")
declare("RINGTREE_RESTART", integer, None, "which replacement this process is", "job")
declare("RINGTREE_MAX_RESTARTS", integer, 0,
        "replacements `ringtree run --max-restarts` may start in all", "job")
declare("RINGTREE_HOST_ID", text, None,
        "override the host identity (tests fake several hosts on one machine)", "job")
declare("RINGTREE_SSH", text, None,
        "the command `ringtree run` starts remote ranks with (default `ssh -o BatchMode=yes`)",
        "tools")
declare("RINGTREE_SIM_NATIVE", flag, True,
        "`ringtree sim`: run the event heap compiled where the package built it (0 = the "
        "same loop in Python)", "tools")
declare("RINGTREE_SIM_ENGINE",
        choice("auto", "batched", "alpha_beta", "fixed_point", "rounds", "native",
               "reference"), "auto",
        "`ringtree sim`: the one engine to run (`auto`: the first of them that accepts a "
        "run; `ringtree sim -v` names it)", "tools")
declare("RINGTREE_PERF_CHILD", flag, False,
        "set by `ringtree perf --nranks` on the ranks it starts", "tools")
declare("RINGTREE_TESTBED_HOST", integer, None,
        "set by `ringtree testbed` for the commands it runs: this host's index", "tools")
declare("RINGTREE_TESTBED_HOSTS", integer, None, "set by `ringtree testbed`: hosts", "tools")
declare("RINGTREE_TESTBED_ADDRS", text, None,
        "set by `ringtree testbed`: every host's address, comma-separated", "tools")
declare("RINGTREE_TESTBED_MASTER", text, None, "set by `ringtree testbed`: host 0's address",
        "tools")


# ---- reading --------------------------------------------------------------------------------

class Settings:
    """Every declared variable's value, parsed once and frozen: ``s.timeout`` is
    ``RINGTREE_TIMEOUT``; ``s.explicit(name)`` says whether the environment set it."""

    __slots__ = ("_values", "_set")

    def __init__(self, values: Mapping[str, Any], explicit: frozenset[str]):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_set", explicit)

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._values[PREFIX + attr.upper()]
        except KeyError:
            raise AttributeError(f"no setting {attr!r} ({PREFIX}{attr.upper()} is not "
                                 f"declared in ringtree.settings)") from None

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError("Settings are frozen")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def explicit(self, name: str) -> bool:
        return name in self._set

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={self._values[n]!r}" for n in sorted(self._set))
        return f"Settings({shown})"


_warned: set[str] = set()


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse every declared variable from ``environ`` (default ``os.environ``). Job
    variables are kept as text: :mod:`ringtree.bootstrap.job` validates them."""
    env = os.environ if environ is None else environ
    values, explicit = {}, set()
    for name, var in VARS.items():
        raw = env.get(name, "").strip()
        if not raw:
            values[name] = var.default
            continue
        try:
            values[name] = raw if var.scope == "job" else var.parse(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}={raw!r}: {e}") from None
        explicit.add(name)
    for name in env:
        if name.startswith(PREFIX) and name not in VARS and name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, VARS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.warn(f"ringtree does not know the environment variable {name}{hint}",
                          stacklevel=2)
    return Settings(values, frozenset(explicit))


_cache: tuple[tuple, Settings] | None = None


def current() -> Settings:
    """The Settings of the environment as it is now (re-parsed only when a ``RINGTREE_``
    variable changed since the last call)."""
    global _cache
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))
    cached = _cache
    if cached is not None and cached[0] == key:
        return cached[1]
    s = load()
    _cache = (key, s)
    return s


def table() -> str:
    """The Markdown table of every variable (``docs/environment.md``)."""
    rows = ["| variable | scope | default | meaning |", "|---|---|---|---|"]
    for var in VARS.values():
        default = "—" if var.default is None or var.default == "" else f"`{var.default}`"
        rows.append(f"| `{var.name}` | {var.scope} | {default} | {var.doc} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    """``ringtree env``: print the table (``--set``: only the variables set here)."""
    if argv and argv[0] not in ("--set",):
        print("usage: ringtree env [--set]")
        return 2
    if argv:
        s = current()
        for name in VARS:
            if s.explicit(name):
                print(f"{name}={s[name]!r}")
        return 0
    print(table(), end="")
    return 0
