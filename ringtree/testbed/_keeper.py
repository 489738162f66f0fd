"""The process that holds one testbed namespace open (run as a script, not imported).

``python _keeper.py NAME FLAGS`` unshares the namespaces named in FLAGS (``n`` network,
``u`` UTS, ``m`` mount), and in them: brings ``lo`` up, sets the host name to NAME, mounts
a private tmpfs on ``/dev/shm`` and a sysfs that shows this namespace's interfaces. It
prints ``ready`` and sleeps until its stdin closes (or its parent dies:
``PR_SET_PDEATHSIG``), then exits — and with its last process the kernel frees the
namespaces, their veth ends and the tmpfs, so nothing outlives the testbed.

Kept free of imports from ringtree so it starts in milliseconds.
"""

import ctypes
import os
import signal
import subprocess
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000
MS_REC, MS_PRIVATE, MNT_DETACH = 0x4000, 1 << 18, 2
PR_SET_PDEATHSIG = 1


def _check(ok: bool, what: str) -> None:
    if not ok:
        err = ctypes.get_errno()
        sys.stdout.write(f"error {what}: {os.strerror(err)}\n")
        sys.stdout.flush()
        sys.exit(1)


def main() -> None:
    name, flags = sys.argv[1], sys.argv[2]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the line above took effect
        sys.exit(1)
    mask = (CLONE_NEWNET if "n" in flags else 0) | (CLONE_NEWUTS if "u" in flags else 0) \
        | (CLONE_NEWNS if "m" in flags else 0)
    _check(libc.unshare(mask) == 0, "unshare")
    if "m" in flags:
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0,
               "making / private")
        _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"mode=1777") == 0,
               "mounting tmpfs on /dev/shm")
        if "n" in flags:  # a sysfs of this network namespace (as `ip netns exec` does)
            libc.umount2(b"/sys", MNT_DETACH)
            libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None)
    if "u" in flags:
        raw = name.encode()
        _check(libc.sethostname(raw, len(raw)) == 0, "sethostname")
    if "n" in flags:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
