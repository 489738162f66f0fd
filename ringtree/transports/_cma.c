/* Cross-memory attach in one C call: process_vm_readv(2) of one or more spans of a
 * peer's memory into this process (or process_vm_writev(2) the other way), with the GIL
 * released (ringtree/transports/shm_cma.py,
 * ringtree/runtime/protocols/ll_direct.py).
 *
 * address(buffer) -> the address of a contiguous buffer's first byte
 *
 * read(pid, spans[, scratch]) -> 0 or an errno
 *   spans: a sequence of (local address, remote address, bytes) triples, read in order.
 *   With `scratch` (a writable buffer that stays in this core's L2) each span is read
 *   into it a scratch at a time and streamed on into place (move_bounced).
 *   Up to IOV_BATCH spans go into one system call (Linux caps an iovec at IOV_MAX = 1024
 *   entries); a short read (the kernel stops at a page it cannot pin, or between iovec
 *   entries on a signal) continues where it stopped. EINTR is retried. The first
 *   failure's errno is returned: ESRCH (the process is gone), EPERM (ptrace access
 *   refused), EFAULT (an address is not mapped), ENOSYS (no CMA in this kernel).
 *
 * write(pid, spans) -> 0 or an errno
 *   the same with process_vm_writev(2): this process's spans into the peer's memory (the
 *   single-copy all-reduce's folded pieces, ringtree/runtime/protocols/ll_direct_fold.py).
 *
 * claim(pid, words, index, local, remote, nbytes, piece, write[, scratch]) -> (errno, pieces)
 *   pieces of one span drawn from a shared counter by an atomic add (see cma_claim); a
 *   read with `scratch` bounces as read's does.
 *
 * stream(dst, src) -> None
 *   copy the buffer src into the writable dst of the same length with non-temporal
 *   stores (x86-64; memcpy elsewhere), GIL released: the single-copy all-gather's own
 *   block, which no rank reads again in the call. A cached store first reads each
 *   destination line for ownership; a streamed one writes it without reading: half the
 *   memory traffic of a copy larger than the caches (docs/design-notes.md, "Single-copy
 *   all-gather ...").
 *
 * Written in C for the call's cost, not the copy's: the kernel copies either way, and
 * ctypes' call releases the GIL too, but a ctypes call with its Structure arguments costs
 * several microseconds, a 64 KiB read about as much again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_kernel.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "_stream.h"
#include "_vm.h"

/* read `len` bytes at `remote` in pid into `local` through the scratch (`slen` bytes):
 * the kernel's copy lands in the scratch, which stays in this core's L2, and a streamed
 * copy takes it on. A copy straight into a buffer larger than the caches reads every
 * destination line for ownership before writing it: 3 memory transfers a line, 2 this
 * way (2 ranks, an all-gather's 8 MiB block: 0.83x the direct read's time,
 * docs/design-notes.md, "Bounced reads") */
static int move_bounced(pid_t pid, char *local, char *remote, size_t len, char *scratch,
                        size_t slen)
{
    for (size_t off = 0; off < len; off += slen) {
        size_t m = len - off < slen ? len - off : slen;
        struct iovec lv = {scratch, m}, rv = {remote + off, m};
        int err = move_spans(pid, &lv, &rv, 1, 0);
        if (err)
            return err;
        stream_copy(local + off, scratch, m);
    }
    return 0;
}

/* the optional scratch argument: 0 and an empty view when absent or None */
static int get_scratch(PyObject *obj, Py_buffer *view)
{
    view->buf = NULL, view->len = 0, view->obj = NULL;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) < 0)
        return -1;
    if (view->len == 0) {
        PyBuffer_Release(view);
        view->buf = NULL, view->obj = NULL;
    }
    return 0;
}

static PyObject *cma_move(PyObject *args, int write)
{
    long pid;
    PyObject *spans, *scratch_obj = NULL;
    Py_buffer scratch;
    if (!PyArg_ParseTuple(args, write ? "lO" : "lO|O", &pid, &spans, &scratch_obj))
        return NULL;
    if (get_scratch(scratch_obj, &scratch) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(spans, "spans must be a sequence of triples");
    if (seq == NULL) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    struct iovec stack_loc[8], stack_rem[8];
    struct iovec *loc = stack_loc, *rem = stack_rem;
    if (n > 8) {
        loc = PyMem_Malloc((size_t)n * sizeof *loc);
        rem = PyMem_Malloc((size_t)n * sizeof *rem);
        if (loc == NULL || rem == NULL) {
            PyMem_Free(loc == stack_loc ? NULL : loc);
            PyMem_Free(rem == stack_rem ? NULL : rem);
            Py_DECREF(seq);
            PyBuffer_Release(&scratch);
            return PyErr_NoMemory();
        }
    }
    Py_ssize_t m = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        unsigned long long a, b, len;
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArg_ParseTuple(t, "KKK", &a, &b, &len)) {
            ok = 0;
            break;
        }
        if (len == 0)
            continue;
        loc[m].iov_base = (void *)(uintptr_t)a;
        loc[m].iov_len = (size_t)len;
        rem[m].iov_base = (void *)(uintptr_t)b;
        rem[m].iov_len = (size_t)len;
        m++;
    }
    int err = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        if (scratch.buf == NULL)
            err = move_spans((pid_t)pid, loc, rem, m, write);
        for (Py_ssize_t i = 0; scratch.buf != NULL && i < m && !err; i++)
            err = move_bounced((pid_t)pid, loc[i].iov_base, rem[i].iov_base, loc[i].iov_len,
                               scratch.buf, (size_t)scratch.len);
        Py_END_ALLOW_THREADS
    }
    if (loc != stack_loc) {
        PyMem_Free(loc);
        PyMem_Free(rem);
    }
    Py_DECREF(seq);
    PyBuffer_Release(&scratch);
    if (!ok)
        return NULL;
    return PyLong_FromLong(err);
}

static PyObject *cma_read(PyObject *self, PyObject *args)
{
    (void)self;
    return cma_move(args, 0);
}

static PyObject *cma_write(PyObject *self, PyObject *args)
{
    (void)self;
    return cma_move(args, 1);
}

/* claim(pid, words, index, local, remote, nbytes, piece, write) -> (errno, pieces)
 * Copy pieces of `piece` bytes of a span between this process (local) and pid (remote),
 * each piece claimed by an atomic fetch-and-add on words[index] (a 64-bit word of shared
 * memory): every process running claim on the same word and span copies the pieces it
 * draws, so each piece is copied exactly once however many race (the single-copy
 * all-gather's shared copies, ringtree/runtime/protocols/ll_direct.py). write: local ->
 * remote (process_vm_writev), else remote -> local. Stops at the first error. */
static PyObject *cma_claim(PyObject *self, PyObject *args)
{
    long pid;
    PyObject *words_obj, *scratch_obj = NULL;
    Py_ssize_t index;
    unsigned long long local, remote, nbytes, piece;
    int write;
    Py_buffer words, scratch;
    (void)self;
    if (!PyArg_ParseTuple(args, "lOnKKKKp|O", &pid, &words_obj, &index, &local, &remote,
                          &nbytes, &piece, &write, &scratch_obj))
        return NULL;
    if (get_scratch(write ? NULL : scratch_obj, &scratch) < 0)
        return NULL;
    if (PyObject_GetBuffer(words_obj, &words, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) < 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    if (piece == 0 || index < 0 || (size_t)(index + 1) * 8 > (size_t)words.len) {
        PyBuffer_Release(&scratch);
        PyBuffer_Release(&words);
        PyErr_SetString(PyExc_ValueError, "claim: piece must be > 0, index a word of words");
        return NULL;
    }
    uint64_t *counter = (uint64_t *)words.buf + index;
    unsigned long long pieces = (nbytes + piece - 1) / piece, done = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        unsigned long long k = __atomic_fetch_add(counter, 1, __ATOMIC_ACQ_REL);
        if (k >= pieces)
            break;
        unsigned long long off = k * piece;
        size_t len = (size_t)(nbytes - off < piece ? nbytes - off : piece);
        struct iovec lv = {(void *)(uintptr_t)(local + off), len};
        struct iovec rv = {(void *)(uintptr_t)(remote + off), len};
        err = scratch.buf != NULL
                  ? move_bounced((pid_t)pid, lv.iov_base, rv.iov_base, len, scratch.buf,
                                 (size_t)scratch.len)
                  : move_spans((pid_t)pid, &lv, &rv, 1, write);
        if (err)
            break;
        done++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&scratch);
    PyBuffer_Release(&words);
    return Py_BuildValue("iK", err, done);
}

static PyObject *cma_stream(PyObject *self, PyObject *args)
{
    PyObject *dst_obj, *src_obj;
    Py_buffer dst, src;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &dst_obj, &src_obj))
        return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_ANY_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len != src.len) {
        PyErr_Format(PyExc_ValueError, "stream: %zd destination bytes for %zd source bytes",
                     dst.len, src.len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        stream_copy(dst.buf, src.buf, (size_t)src.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* address(buffer) -> the address of a contiguous buffer's first byte (NumPy's
 * __array_interface__ builds a dictionary for it: about 100x the cost) */
static PyObject *cma_address(PyObject *self, PyObject *obj)
{
    Py_buffer view;
    (void)self;
    if (PyObject_GetBuffer(obj, &view, PyBUF_ANY_CONTIGUOUS) < 0)
        return NULL;
    PyObject *r = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)view.buf);
    PyBuffer_Release(&view);
    return r;
}

static PyMethodDef methods[] = {
    {"address", cma_address, METH_O, "address(buffer) -> its first byte's address"},
    {"read", cma_read, METH_VARARGS,
     "read(pid, [(local, remote, nbytes), ...]) -> 0 or errno: process_vm_readv, GIL "
     "released"},
    {"write", cma_write, METH_VARARGS,
     "write(pid, [(local, remote, nbytes), ...]) -> 0 or errno: process_vm_writev, GIL "
     "released"},
    {"claim", cma_claim, METH_VARARGS,
     "claim(pid, words, index, local, remote, nbytes, piece, write) -> (errno, pieces): "
     "copy the pieces drawn from the shared counter words[index]"},
    {"stream", cma_stream, METH_VARARGS,
     "stream(dst, src): copy src into dst (same length) with non-temporal stores"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cma", "process_vm_readv with the GIL released", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cma(void)
{
    return rt_module_create(&module);
}
