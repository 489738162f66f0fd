/* The single copy's whole call in one entry (ringtree/runtime/protocols/ll_direct.py,
 * ll_direct_fold.py, ll_direct_entry.py): the two synchronisations of a single-copy
 * call and the moves between them, with the GIL released, no Python between them.
 *
 * Part of _llc.c (included after the Round, its waits and push_body): a Round set up
 * with direct() runs, in dcall(), LL call s (every rank posts its input's and its
 * output's addresses in its line's inline payload and waits for every peer's), the
 * moves through the kernel (process_vm_readv / process_vm_writev, _vm.h), then LL call
 * s + 1 (every rank posts its moves' status; an all-gather's own block is copied
 * between that post and the wait), and looks at the statuses. The words, the moves and
 * their order are those of the Python steps, so kernel and Python ranks run one job.
 *
 * What it hands back to Python (ll_direct_entry.Compiled.after): a code of call s
 * (RING, a late peer i >= 0, a mismatch -2 - i; nothing after the post done: Python finishes
 * that wait and runs the moves and call s + 1 itself), SECOND + a code of call s + 1
 * (the moves and the own copy done: Python finishes that wait and reads the statuses),
 * D_GONE + (q << 1 | wrote) (peer q's process is gone: ESRCH on a move; Python names
 * it), D_FAILED (both calls done, a rank's status is set: Python raises, naming it). */

#define D_GONE (1 << 26)
#define D_FAILED (1 << 27)
/* the moves (direct()'s mode): an all-gather's pushes or reads, a reduce-scatter's and an
 * all-reduce's fold (fold_push's loop), a broadcast's read of the root's buffer */
enum { DM_PUSH = 1, DM_READ, DM_FOLD, DM_FOLD_PUSH, DM_BCAST };
enum { DP_STATUS = 0, DP_ADDR = 1, DP_OUT = 3 };      /* inline payload words (ll_direct) */
/* an all-gather's own copy: the segment's cached loop (cached_copy), streaming stores
 * (large outputs), or glibc's memcpy (where offsets in a cache line cost its rep movsb
 * nothing: ll_direct_entry asks shm_cma.offsets_matter) */
enum { OWN_CACHED = 0, OWN_STREAM, OWN_MEMCPY };

typedef struct DirectCall {
    int mode, n, me;
    Py_ssize_t block;                  /* gather: a block's bytes; fold: the input's */
    Py_ssize_t lo, hi;                 /* fold: this rank's block, bytes of the input;
                                        * broadcast: the root in lo */
    Py_ssize_t piece;                  /* fold: bytes of a peer's row a move */
    int own_copy;                      /* gather: the own copy's stores (OWN_*) */
    Py_ssize_t pay[2][MAXR];           /* every rank's inline payload word, by parity */
    Py_ssize_t pid[MAXR], order[MAXR]; /* pids by rank; the fold's order */
    Py_buffer scratch;                 /* fold: (ranks - 1) slots of a piece and a page */
} DirectCall;

static void direct_free(DirectCall *d) {
    if (d == NULL)
        return;
    if (d->scratch.obj != NULL)
        PyBuffer_Release(&d->scratch);
    PyMem_Free(d);
}

/* the moves between the two calls (every rank's words of parity p posted): 0, or
 * q << 32 | errno of the first failed move (| PUSH_WROTE for a write into q) */
static long long direct_moves(Round *k, const DirectCall *d, int p, const char *x,
                              char *out) {
    Py_ssize_t in_at[MAXR], out_at[MAXR];
    for (int q = 0; q < d->n; q++) {
        in_at[q] = (Py_ssize_t)*word(k, d->pay[p][q] + DP_ADDR);
        out_at[q] = (Py_ssize_t)*word(k, d->pay[p][q] + DP_OUT);
    }
    if (d->mode == DM_FOLD || d->mode == DM_FOLD_PUSH) {
        Py_ssize_t len = d->hi - d->lo;
        if (len == 0)
            return 0;
        for (int q = 0; q < d->n; q++)
            in_at[q] += d->lo, out_at[q] += d->lo;
        char *own = (char *)x + d->lo;
        char *dst = d->mode == DM_FOLD ? out : out + d->lo;
        return push_body(k->fold, ITEMSIZE[k->dtype], d->n, d->me, d->pid, in_at,
                         d->mode == DM_FOLD ? NULL : out_at, d->order, own, dst, len,
                         d->piece, d->scratch.buf);
    }
    Py_ssize_t nb = d->block;
    if (d->mode == DM_BCAST) { /* every rank but the root reads the root's buffer */
        int root = (int)d->lo;
        if (d->me == root || nb == 0)
            return 0;
        struct iovec lv = {out, (size_t)nb};
        struct iovec rv = {(void *)in_at[root], (size_t)nb};
        int err = move_spans((pid_t)d->pid[root], &lv, &rv, 1, 0);
        return err ? (long long)root << 32 | err : 0;
    }
    for (int j = 1; j < d->n && nb > 0; j++) {
        int q = (d->me + j) % d->n, write = d->mode == DM_PUSH;
        struct iovec lv = {write ? (char *)x : out + q * nb, (size_t)nb};
        struct iovec rv = {(void *)(write ? out_at[q] + d->me * nb : in_at[q]), (size_t)nb};
        int err = move_spans((pid_t)d->pid[q], &lv, &rv, 1, write);
        if (err)
            return (long long)q << 32 | (write ? PUSH_WROTE : 0) | err;
    }
    return 0;
}

/* the call (GIL released): call s, the moves, call s + 1; -1 or a code (above) */
static int direct_body(Round *k, uint64_t s, const uint64_t h[3], const char *x,
                       char *out) {
    const DirectCall *d = k->dc;
    int p = (int)(s & 1);
    volatile uint64_t *mine = word(k, d->pay[p][d->me]);
    mine[DP_ADDR] = (uint64_t)(uintptr_t)x;
    mine[DP_OUT] = (uint64_t)(uintptr_t)out;
    int r = publish_wait(k, p, s, h);
    if (r != -1)
        return r;
    long long status = direct_moves(k, d, p, x, out);
    if (status && (status & 0xFFFF) == ESRCH)
        return D_GONE + (int)((status >> 32) << 1 | ((status & PUSH_WROTE) != 0));
    uint64_t s2 = s + 1;
    const uint64_t h2[3] = {h[0], (h[1] & ~(uint64_t)0xFFFFFFFFu) | (s2 & 0xFFFFFFFFu), h[2]};
    *word(k, d->pay[1 - p][d->me] + DP_STATUS) = (uint64_t)status;
    r = publish(k, 1 - p, s2, h2);
    if (d->mode == DM_PUSH || d->mode == DM_READ) { /* the own block, while peers copy */
        char *own = out + d->me * d->block;
        if (own != x && d->own_copy == OWN_MEMCPY)
            memcpy(own, x, (size_t)d->block);
        else if (own != x)
            copy_out(own, x, d->block, d->own_copy == OWN_STREAM);
    } else if (d->mode == DM_BCAST && d->me == (int)d->lo && out != x) {
        memcpy(out, x, (size_t)d->block); /* the root's own copy, while peers read */
    }
    if (r == -1)
        r = wait_peers(k, 1 - p, s2, 0);
    if (r != -1)
        return SECOND + r;
    for (int q = 0; q < d->n; q++)
        if (*word(k, d->pay[1 - p][q] + DP_STATUS))
            return D_FAILED;
    return -1;
}

/* direct(mode, me, pids, pay0, pay1, order, block, lo, hi, piece, own_copy, scratch)
 * -> None: this Round runs the single copy's calls (dcall). mode: DM_*; pids, pay0,
 * pay1: by rank, the pid and the inline payload's first word of parity 0 and 1; order:
 * the fold's ranks (folds; else empty); block: a gather's block bytes, a fold's input
 * bytes, a broadcast's buffer bytes; lo, hi: a fold's own block (a broadcast: the root
 * in lo); piece, scratch: fold_push's; own_copy: OWN_* */
static PyObject *Round_direct(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "direct(mode, me, pids, pay0, pay1, order, block, "
                                         "lo, hi, piece, own_copy, scratch)");
        return NULL;
    }
    DirectCall *d = PyMem_Calloc(1, sizeof(DirectCall));
    if (d == NULL)
        return PyErr_NoMemory();
    d->mode = (int)PyLong_AsLong(args[0]), d->me = (int)PyLong_AsLong(args[1]);
    d->n = k->npeers + 1;
    d->block = PyLong_AsSsize_t(args[6]), d->lo = PyLong_AsSsize_t(args[7]);
    d->hi = PyLong_AsSsize_t(args[8]), d->piece = PyLong_AsSsize_t(args[9]);
    d->own_copy = (int)PyLong_AsLong(args[10]);
    int folds = d->mode == DM_FOLD || d->mode == DM_FOLD_PUSH;
    if (PyErr_Occurred() || read_index_list(args[2], d->n, d->pid, "direct: pids") < 0 ||
        read_index_list(args[3], d->n, d->pay[0], "direct: pay0") < 0 ||
        read_index_list(args[4], d->n, d->pay[1], "direct: pay1") < 0 ||
        read_index_list(args[5], folds ? d->n : 0, d->order, "direct: order") < 0) {
        direct_free(d);
        return NULL;
    }
    if (folds && k->fold == NULL)
        k->fold = pick(k->dtype, k->op); /* (a round made without rows has none) */
    int bad = d->mode < DM_PUSH || d->mode > DM_BCAST || d->me < 0 || d->me >= d->n ||
              (d->mode == DM_BCAST && (d->lo < 0 || d->lo >= d->n)) ||
              d->n < 2 || d->block < 0 || d->own_copy < OWN_CACHED ||
              d->own_copy > OWN_MEMCPY ||
              (folds && (k->fold == NULL || d->lo < 0 || d->lo > d->hi || d->hi > d->block ||
                         d->piece <= 0 || d->piece % ITEMSIZE[k->dtype]));
    Py_ssize_t top = (k->seg.len >> 3) - 4;
    for (int q = 0; q < d->n && !bad; q++)
        bad = d->pay[0][q] < 0 || d->pay[1][q] < 0 || d->pay[0][q] > top ||
              d->pay[1][q] > top || (folds && (d->order[q] < 0 || d->order[q] >= d->n));
    if (bad) {
        direct_free(d);
        PyErr_SetString(PyExc_ValueError, "direct: a bad mode, rank, size, word or order, "
                                          "or a fold the round cannot make");
        return NULL;
    }
    if (folds && (PyObject_GetBuffer(args[11], &d->scratch, PyBUF_WRITABLE |
                                     PyBUF_C_CONTIGUOUS) < 0 ||
                  d->scratch.len < (d->n - 1) * (d->piece + 4096))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "direct: scratch of (ranks - 1) pieces and "
                                              "pages");
        direct_free(d);
        return NULL;
    }
    direct_free(k->dc);
    k->dc = d;
    Py_RETURN_NONE;
}

/* dcall(x, out, s, seq[, ident]) -> int: the single copy's call s and s + 1 in one
 * entry (direct_body), recorded as collective `seq` as hot() records (seq < 0: not
 * recorded, the caller records); ident as hot()'s.
 * x and out C-contiguous of one format; an all-reduce's and a broadcast's of one length
 * (out may be x), an all-gather's out `ranks` blocks of x's length, a reduce-scatter's x
 * `ranks` blocks of out's, not overlapping but in place (x the all-gather's own block,
 * out the reduce-scatter's: push_body folds through a tile where its output is its
 * row). NOBUF when they are not (nothing done: the general path), NOTMINE from another
 * thread; else -1 or a code (above). */
static PyObject *Round_dcall(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    int other = not_mine(args, &nargs);
    if (other)
        return other < 0 ? NULL : PyLong_FromLong(NOTMINE);
    uint64_t s;
    long long seq;
    const DirectCall *d = k->dc;
    if (entry_words("dcall(x, out, s, seq[, ident])", args, nargs, &s, &seq) < 0)
        return NULL;
    if (d == NULL) {
        PyErr_SetString(PyExc_ValueError, "dcall: no direct() set");
        return NULL;
    }
    int inplace = (d->mode == DM_FOLD_PUSH || d->mode == DM_BCAST) &&
                  (args[1] == Py_None || args[1] == args[0]);
    Py_buffer xb, ob;
    if (inplace) {
        if (take_buffer(args[0], &xb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            return PyLong_FromLong(NOBUF);
        }
        ob = xb;
    } else if (hot_args("dcall(x, out, s, seq[, ident])", args, 4, &s, &seq, &xb, &ob,
                        d->mode == DM_PUSH || d->mode == DM_READ || d->mode == DM_FOLD
                        ? d->me : -1) != 0) {
        return PyErr_Occurred() ? NULL : PyLong_FromLong(NOBUF);
    }
    int whole = d->mode == DM_FOLD_PUSH || d->mode == DM_BCAST; /* x and out alike */
    Py_ssize_t want_x = d->mode == DM_FOLD ? d->block : whole ? ob.len : ob.len / d->n;
    Py_ssize_t want_o = d->mode == DM_FOLD ? d->hi - d->lo : whole
                        ? d->block : (Py_ssize_t)d->n * d->block;
    int fits = xb.len == want_x && ob.len == want_o &&
               (d->mode == DM_FOLD || d->mode == DM_FOLD_PUSH || xb.len == d->block) &&
               (k->descr == NULL || has_descr(args[0], k->descr));
    if (!fits) {
        PyBuffer_Release(&xb);
        if (!inplace)
            PyBuffer_Release(&ob);
        return PyLong_FromLong(NOBUF);
    }
    int64_t *mark = seq >= 0 ? fr_start(k, seq) : NULL;
    const uint64_t h[3] = {k->head[0], k->head[1] | (s & 0xFFFFFFFFu), k->head[2]};
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = direct_body(k, s, h, xb.buf, ob.buf);
    Py_END_ALLOW_THREADS
    return entry_end(k, &xb, inplace ? NULL : &ob, mark, seq, r);
}
