/* The congestion-aware event heap of the reference engine, compiled.
 *
 * ringtree/sim/engines/reference.py (_Engine.loop and the step side it drives: drain,
 * slices, ready, inject, deliver, finish) is the reference: this file performs its
 * operations in its order on the same state laid out as flat arrays
 * (ringtree/sim/engines/native.py packs and unpacks them), so it reaches the same floats.  Every comparison is the same `if a > t`, every
 * sum has the same operands left to right, the work stack is the same LIFO, and the heap
 * pops the same items in the same order: its keys (arrival, message, slice) are distinct
 * while queued (no two queued items share a message and slice), so any heap pops them in
 * one order, the order heapq pops them (this one is 4-ary).  Doubles are IEEE binary64 and the file is
 * built without contraction (-ffp-contract=off): `st + ser + llat` is two roundings, as in
 * Python.  `float(int(t))` is trunc(t) for the finite, non-negative times of a run.
 *
 * A message's arrivals are appended at narr[m] (Python's `arr[m].append(t)`); the slices
 * a message has ready while its connection still carries an earlier message wait in
 * order 0, 1, 2 ... (none of them can have left), so wait_t keeps only their times.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../../_kernel.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double t;
    int64_t m, i, h;
} Item;

typedef struct {
    /* structure, read only */
    const int64_t *sl_start, *sl_n, *pool_b, *comp_start, *rv_off, *rv, *sd_off, *sd, *nic,
        *dp_off, *dp, *msg_conn, *msg_rstep, *msg_sstep, *cl_off, *cl, *shared, *arr_off;
    const double *pool_c, *conn_first, *rate, *llat;
    /* state, read and written */
    int64_t *pend, *nxt, *unsent, *narr, *ninj, *nwait, *conn_cur;
    double *start, *done, *maxin, *last, *sdone, *arr_t, *wait_t, *conn_inj, *conn_arr, *free_;
    double over;
    int integer;
    int64_t nmsgs;
    char *head;              /* per message: its first link is shared */
    Item *heap;
    size_t hn, hcap;
    int64_t *work;
    size_t wn, wcap;
} S;

static int less(const Item *a, const Item *b)
{
    if (a->t != b->t) return a->t < b->t;
    if (a->m != b->m) return a->m < b->m;
    if (a->i != b->i) return a->i < b->i;
    return a->h < b->h;
}

/* a 4-ary heap: half the levels of a binary one, its children on one or two cache lines */
#define ARITY 4

static void sift_down(Item *h, size_t n, size_t pos)
{
    Item x = h[pos];
    for (;;) {
        size_t c = ARITY * pos + 1;
        if (c >= n) break;
        size_t end = c + ARITY < n ? c + ARITY : n, best = c;
        for (size_t k = c + 1; k < end; k++)
            if (less(&h[k], &h[best])) best = k;
        if (!less(&h[best], &x)) break;
        h[pos] = h[best];
        pos = best;
    }
    h[pos] = x;
}

/* room for one more element in a growing array (doubled when full) */
static int grow(void **buf, size_t *cap, size_t n, size_t size)
{
    if (n < *cap) return 0;
    size_t want = *cap ? 2 * *cap : 1024;
    void *p = realloc(*buf, want * size);
    if (!p) { PyErr_NoMemory(); return -1; }
    *buf = p;
    *cap = want;
    return 0;
}

static int heap_push(S *s, double t, int64_t m, int64_t i, int64_t hop)
{
    if (grow((void **)&s->heap, &s->hcap, s->hn, sizeof(Item)) < 0) return -1;
    Item x = {t, m, i, hop};
    size_t pos = s->hn++;
    while (pos > 0) {
        size_t up = (pos - 1) / ARITY;
        if (!less(&x, &s->heap[up])) break;
        s->heap[pos] = s->heap[up];
        pos = up;
    }
    s->heap[pos] = x;
    return 0;
}

static Item heap_pop(S *s)
{
    Item top = s->heap[0];
    s->hn--;
    if (s->hn) {
        s->heap[0] = s->heap[s->hn];
        sift_down(s->heap, s->hn, 0);
    }
    return top;
}

/* heapq.heappushpop: the smaller of the item and the heap's first */
static Item heap_pushpop(S *s, Item x)
{
    if (s->hn && less(&s->heap[0], &x)) {
        Item top = s->heap[0];
        s->heap[0] = x;
        sift_down(s->heap, s->hn, 0);
        return top;
    }
    return x;
}

static int work_push(S *s, int64_t st)
{
    if (grow((void **)&s->work, &s->wcap, s->wn, sizeof(int64_t)) < 0) return -1;
    s->work[s->wn++] = st;
    return 0;
}

static inline double slice_bytes(const S *s, int64_t m, int64_t i)
{
    return (double)s->pool_b[s->sl_start[s->msg_sstep[m]] + i];
}

/* link li serves a chunk of b bytes arriving at t (a FIFO): when it leaves the link's
 * far end; the engine's sums, in its order */
static inline double serve(S *s, int64_t li, double t, double b)
{
    double st = s->free_[li];
    if (t > st) st = t;
    double ser = b / s->rate[li];
    s->free_[li] = st + ser;
    t = st + ser + s->llat[li];
    return s->integer ? trunc(t) : t;
}

/* the delivery at the end of `carry` */
static int deliver(S *s, int64_t m, int64_t i, double t)
{
    int64_t c = s->msg_conn[m];
    if (t < s->conn_arr[c]) t = s->conn_arr[c];
    s->conn_arr[c] = t;
    s->arr_t[s->arr_off[m] + s->narr[m]] = t;
    s->narr[m] += 1;
    int64_t r = s->msg_rstep[m];
    if (s->start[r] >= 0.0 && s->nxt[r] == i) return work_push(s, r);
    return 0;
}

/* heap.py's `carry`: from hop `hop` up to the next shared link (queued) or the end */
static int carry(S *s, int64_t m, int64_t i, double t, int64_t hop)
{
    double b = slice_bytes(s, m, i);
    int64_t c = s->msg_conn[m];
    const int64_t *links = s->cl + s->cl_off[c];
    int64_t n = s->cl_off[c + 1] - s->cl_off[c];
    for (int64_t h = hop; h < n; h++) {
        int64_t li = links[h];
        if (s->shared[li] && h != hop) return heap_push(s, t, m, i, h);
        t = serve(s, li, t, b);
    }
    return deliver(s, m, i, t);
}

/* heap.py's `inject` (aware, no rounds) and `injected` */
static int inject(S *s, int64_t m, int64_t i, double t)
{
    int64_t c = s->msg_conn[m];
    if (t < s->conn_inj[c]) t = s->conn_inj[c];
    int64_t st = s->msg_sstep[m];
    int64_t nsl = s->sl_n[st];
    double b = slice_bytes(s, m, i);
    double first = s->conn_first[c];
    s->conn_inj[c] = t;
    double fin = t + ((b != 0.0 && first != INFINITY) ? b / first : 0.0);
    if (fin > s->sdone[st]) s->sdone[st] = fin;
    s->unsent[st] -= 1;
    if (s->unsent[st] == 0 && s->nxt[st] == nsl && work_push(s, st) < 0) return -1;
    if (s->head[m]) {
        if (heap_push(s, t + s->over, m, i, 0) < 0) return -1;
    } else if (carry(s, m, i, t + s->over, 0) < 0) {
        return -1;
    }
    s->ninj[m] += 1;
    if (s->ninj[m] == nsl) {
        int64_t nm = m + 1;
        if (nm < s->nmsgs && s->msg_conn[nm] == c) {
            s->conn_cur[c] = nm;
            int64_t k = s->nwait[nm];
            s->nwait[nm] = 0;
            const double *w = s->wait_t + s->arr_off[nm];
            for (int64_t j = 0; j < k; j++)
                if (inject(s, nm, j, w[j]) < 0) return -1;
        }
    }
    return 0;
}

/* the engine's `drain`: begin, slices, ready, finish */
static int drain(S *s)
{
    while (s->wn) {
        int64_t st = s->work[--s->wn];
        if (s->done[st] >= 0.0) continue;
        if (s->start[st] < 0.0) {
            if (s->pend[st]) continue;
            double t = s->maxin[st];
            s->start[st] = t;
            s->last[st] = t;
            int64_t ns_ = s->nic[st];
            if (ns_ >= 0) {
                if (t > s->maxin[ns_]) s->maxin[ns_] = t;
                s->pend[ns_] -= 1;
                if (s->pend[ns_] == 0 && work_push(s, ns_) < 0) return -1;
            }
        }
        int64_t nsl = s->sl_n[st];
        const double *cs = s->comp_start[st] >= 0 ? s->pool_c + s->comp_start[st] : NULL;
        int64_t r0 = s->rv_off[st], r1 = s->rv_off[st + 1];
        int64_t d0 = s->sd_off[st], d1 = s->sd_off[st + 1];
        int64_t i = s->nxt[st];
        while (i < nsl) {
            double t = s->last[st];
            int ready = 1;
            for (int64_t k = r0; k < r1; k++) {
                int64_t m = s->rv[k];
                if (s->narr[m] <= i) { ready = 0; break; }
                double a = s->arr_t[s->arr_off[m] + i];
                if (a > t) t = a;
            }
            if (!ready) break;
            if (cs) t += cs[i];
            s->last[st] = t;
            s->nxt[st] = i + 1;
            for (int64_t k = d0; k < d1; k++) {
                int64_t m = s->sd[k];
                if (s->conn_cur[s->msg_conn[m]] == m) {
                    if (inject(s, m, i, t) < 0) return -1;
                } else {
                    if (s->nwait[m] != i) {
                        PyErr_Format(PyExc_RuntimeError, "native heap: message %lld has "
                                     "%lld slices waiting, slice %lld ready", (long long)m,
                                     (long long)s->nwait[m], (long long)i);
                        return -1;
                    }
                    s->wait_t[s->arr_off[m] + s->nwait[m]] = t;
                    s->nwait[m] += 1;
                }
            }
            i = s->nxt[st];
        }
        if (s->nxt[st] != nsl || s->unsent[st] || s->done[st] >= 0.0) continue;
        double t = nsl ? s->last[st] : s->start[st];
        if (s->sdone[st] > t) t = s->sdone[st];
        s->done[st] = t;
        for (int64_t k = s->dp_off[st]; k < s->dp_off[st + 1]; k++) {
            int64_t d = s->dp[k];
            if (t > s->maxin[d]) s->maxin[d] = t;
            s->pend[d] -= 1;
            if (s->pend[d] == 0 && work_push(s, d) < 0) return -1;
        }
    }
    return 0;
}

static int run_loop(S *s, int64_t *events, PyObject *progress)
{
    int64_t ev = *events;
    for (;;) {
        if (drain(s) < 0) goto fail;
        if (!s->hn) break;
        Item it = heap_pop(s);
        for (;;) {
            ev += 1;
            if (!(ev & 0xFFFF)) {
                if (PyErr_CheckSignals() < 0) goto fail;
                if (progress != Py_None) {
                    PyObject *r = PyObject_CallFunction(progress, "L", (long long)ev);
                    if (!r) goto fail;
                    Py_DECREF(r);
                }
            }
            int64_t m = it.m, i = it.i, h = it.h;
            double t = it.t;
            double b = slice_bytes(s, m, i);
            int64_t c = s->msg_conn[m];
            const int64_t *links = s->cl + s->cl_off[c];
            int64_t n = s->cl_off[c + 1] - s->cl_off[c];
            int64_t li = links[h];
            for (;;) {
                t = serve(s, li, t, b);
                h += 1;
                if (h == n) break;
                li = links[h];
                if (s->shared[li]) break;
            }
            if (h < n) {
                Item x = {t, m, i, h};
                it = heap_pushpop(s, x);
                continue;
            }
            if (deliver(s, m, i, t) < 0) goto fail;
            break;
        }
    }
    *events = ev;
    return 0;
fail:
    *events = ev;
    return -1;
}

/* ---- argument unpacking -------------------------------------------------------- */

#define NARRAYS 39
enum { NINT_RO = 18, NFLT_RO = 4, NINT_RW = 7, NFLT_RW = 10 };

static int view(PyObject *o, Py_buffer *v, char kind, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) < 0) return -1;
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = v->itemsize == 8 && (kind == 'd' ? *f == 'd' : (*f == 'q' || *f == 'l'));
    if (!ok) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_TypeError, "native heap: expected %s arrays",
                     kind == 'd' ? "float64" : "int64");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(run_doc,
"run(arrays, over, integer, events, work, progress) -> events\n\n"
"Run the event heap to the end on the packed state (ringtree.sim.native), in place.");

static PyObject *run(PyObject *self, PyObject *args)
{
    PyObject *arrays, *work, *progress;
    double over;
    int integer;
    long long events;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!dpLOO", &PyTuple_Type, &arrays, &over, &integer, &events,
                          &work, &progress))
        return NULL;
    if (PyTuple_GET_SIZE(arrays) != NARRAYS) {
        PyErr_Format(PyExc_ValueError, "native heap: %d arrays expected", NARRAYS);
        return NULL;
    }
    Py_buffer v[NARRAYS + 1];
    int got = 0;
    PyObject *result = NULL;
    S s;
    memset(&s, 0, sizeof s);
    for (; got < NARRAYS; got++) {
        char kind = (got >= NINT_RO && got < NINT_RO + NFLT_RO) ||
                    got >= NINT_RO + NFLT_RO + NINT_RW ? 'd' : 'q';
        if (view(PyTuple_GET_ITEM(arrays, got), &v[got], kind, got >= NINT_RO + NFLT_RO) < 0)
            goto out;
    }
    if (view(work, &v[NARRAYS], 'q', 0) < 0) goto out;
    got++;
    {
        const int64_t **ri[NINT_RO] = {&s.sl_start, &s.sl_n, &s.pool_b, &s.comp_start,
                                       &s.rv_off, &s.rv, &s.sd_off, &s.sd, &s.nic, &s.dp_off,
                                       &s.dp, &s.msg_conn, &s.msg_rstep, &s.msg_sstep,
                                       &s.cl_off, &s.cl, &s.shared, &s.arr_off};
        const double **rf[NFLT_RO] = {&s.pool_c, &s.conn_first, &s.rate, &s.llat};
        int64_t **wi[NINT_RW] = {&s.pend, &s.nxt, &s.unsent, &s.narr, &s.ninj, &s.nwait,
                                 &s.conn_cur};
        double **wf[NFLT_RW] = {&s.start, &s.done, &s.maxin, &s.last, &s.sdone, &s.arr_t,
                                &s.wait_t, &s.conn_inj, &s.conn_arr, &s.free_};
        int k = 0;
        for (int j = 0; j < NINT_RO; j++) *ri[j] = v[k++].buf;
        for (int j = 0; j < NFLT_RO; j++) *rf[j] = v[k++].buf;
        for (int j = 0; j < NINT_RW; j++) *wi[j] = v[k++].buf;
        for (int j = 0; j < NFLT_RW; j++) *wf[j] = v[k++].buf;
    }
    s.over = over;
    s.integer = integer;
    s.nmsgs = v[11].len / 8;                              /* msg_conn */
    s.head = malloc(s.nmsgs ? (size_t)s.nmsgs : 1);
    if (!s.head) { PyErr_NoMemory(); goto out; }
    for (int64_t m = 0; m < s.nmsgs; m++) {
        int64_t c = s.msg_conn[m];
        s.head[m] = s.cl_off[c + 1] > s.cl_off[c] && s.shared[s.cl[s.cl_off[c]]] != 0;
    }
    {
        const int64_t *w = v[NARRAYS].buf;
        Py_ssize_t nw = v[NARRAYS].len / 8;
        for (Py_ssize_t j = 0; j < nw; j++)
            if (work_push(&s, w[j]) < 0) goto out;
    }
    {
        int64_t ev = events;
        if (run_loop(&s, &ev, progress) < 0) goto out;
        result = PyLong_FromLongLong(ev);
    }
out:
    for (int j = 0; j < got; j++) PyBuffer_Release(&v[j]);
    free(s.head);
    free(s.heap);
    free(s.work);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_heapc",
    "The event heap of ringtree.sim.heap, compiled (see ringtree.sim.native).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__heapc(void)
{
    return rt_module_create(&module);
}
