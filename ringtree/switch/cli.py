"""``ringtree switch``: run an aggregation switch until SIGINT/SIGTERM.

    ringtree switch --listen 10.0.0.9:7000 --token-file job.tokens [--slots N]
                    [--slot-bytes B] [--drop P] [--seed S] [--parent ADDR:PORT]

Tokens: ``--token T`` (repeatable), ``--token-file F`` (one per line) or, if neither is
given, ``RINGTREE_TOKEN``. The switch prints its counters on SIGUSR1 and on exit.
"""

from __future__ import annotations

import argparse
import signal
import sys

from ringtree.bootstrap import environ
from ringtree.switch.server import SwitchServer


def _addr(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host or "0.0.0.0", int(port)


def _size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    mult = units.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if s[-1:] in units else s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 256K, got {s!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringtree switch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=_addr, required=True, metavar="ADDR:PORT")
    p.add_argument("--slots", type=int, default=256, help="aggregation slots in the pool")
    p.add_argument("--slot-bytes", type=_size, default=256 << 10,
                   help="bytes per slot (largest chunk)")
    p.add_argument("--drop", type=float, default=0.0,
                   help="fraction of received chunks to drop (seeded), to test recovery")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parent", type=_addr, default=None, metavar="ADDR:PORT",
                   help="the switch above this one in the aggregation tree")
    p.add_argument("--token", action="append", default=[], help="a job token to serve")
    p.add_argument("--token-file", default=None, help="job tokens, one per line")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    tokens = list(args.token)
    if args.token_file:
        with open(args.token_file) as f:
            tokens += [line.strip() for line in f if line.strip()]
    token = environ.get("RINGTREE_TOKEN")
    if not tokens and token:
        tokens.append(token)
    if args.slots < 1 or args.slot_bytes < 64:
        print("ringtree switch: --slots must be >= 1 and --slot-bytes >= 64", file=sys.stderr)
        return 2
    try:
        srv = SwitchServer(*args.listen, tokens, slots=args.slots, slot_bytes=args.slot_bytes,
                           drop=args.drop, seed=args.seed, parent=args.parent)
    except (ValueError, OSError) as e:
        print(f"ringtree switch: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGUSR1, lambda *_: print(srv.report(), flush=True))
    signal.signal(signal.SIGTERM, lambda *_: srv.stop())
    print(f"ringtree switch listening on {srv.address}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        print(srv.report(), flush=True)
        srv.close()
    return 0
