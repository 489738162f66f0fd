/* move_spans: process_vm_readv(2) of spans of another process's memory into this one
 * (write: process_vm_writev(2), the other way), up to IOV_BATCH spans a system call
 * (Linux caps an iovec at IOV_MAX = 1024 entries). A short transfer (the kernel stops at
 * a page it cannot pin, or between iovec entries on a signal) continues where it
 * stopped; EINTR is retried. 0, or the first failure's errno: ESRCH (the process is
 * gone), EPERM (ptrace access refused), EFAULT (an address is not mapped), ENOSYS (no
 * cross-memory attach in this kernel). The iovecs are advanced in place.
 * Shared by the single-copy module (_cma.c) and the LL kernel's single-copy all-reduce
 * (_llc.c, fold_push). */
#ifndef RINGTREE_VM_H
#define RINGTREE_VM_H

#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>

#define IOV_BATCH 64

static int move_spans(pid_t pid, struct iovec *loc, struct iovec *rem, Py_ssize_t n,
                      int write)
{
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t k = n - i < IOV_BATCH ? n - i : IOV_BATCH;
        ssize_t got = write ? process_vm_writev(pid, loc + i, (unsigned long)k, rem + i,
                                                (unsigned long)k, 0)
                            : process_vm_readv(pid, loc + i, (unsigned long)k, rem + i,
                                               (unsigned long)k, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            return EFAULT;
        /* skip the spans read whole, then advance into a partly read one */
        while (i < n && (size_t)got >= loc[i].iov_len) {
            got -= (ssize_t)loc[i].iov_len;
            i++;
        }
        if (got > 0) {
            loc[i].iov_base = (char *)loc[i].iov_base + got;
            loc[i].iov_len -= (size_t)got;
            rem[i].iov_base = (char *)rem[i].iov_base + got;
            rem[i].iov_len -= (size_t)got;
        }
    }
    return 0;
}

#endif
