/* LL's data path compiled: one round of a one-shot collective on the LL segment
 * (ringtree/transports/shm_ll.py has the layout and the protocol, shm_native.py the
 * Python side).
 *
 * A Round is prepared once per call shape with the segment and every word index and
 * byte offset it uses, so a call is one C entry: copy the contribution into this
 * rank's area, write the header and then the sequence word (a release store), a full
 * fence, look at the peers' sleep flags
 * (Dekker with the sleeper: a sleeping peer makes the call return to Python, which
 * rings its doorbell), wait for every peer's line with the GIL released (spin with
 * `pause`, then sched_yield, for at most the budgets given: the sleep, the liveness
 * checks and the timeout stay in Python), compare headers, fold the contributions in
 * the Program's order into the output.
 *
 * Folding is bitwise the rank-order fold NumPy does: every element is
 * ((c0 op c1) op c2) ..., each op one IEEE operation in the dtype (float16 is not
 * handled here; bfloat16 is computed in float32 and rounded to nearest-even, NaNs
 * quietened, as ringtree.dtypes.f32_to_bf16), built with -ffp-contract=off and no
 * fast-math, so no FMA and no reassociation (-fno-trapping-math only lets the NaN
 * selects below vectorise). Integers wrap (unsigned arithmetic). NaNs and MIN/MAX: see
 * FLOAT_OPS. The fold walks the output in blocks that stay in L1, so with many
 * contributions the output is written once per block, not once per rank.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../_kernel.h"
#include "_ndview.h"
#include "_stream.h"
#include "_vm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

enum { D_INT8, D_UINT8, D_INT32, D_UINT32, D_INT64, D_UINT64, D_FLOAT16, D_BFLOAT16,
       D_FLOAT32, D_FLOAT64, D_COUNT };
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_AVG, O_PREMUL, O_BAND, O_BOR, O_BXOR, O_COUNT };
static const int ITEMSIZE[D_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
#define BLOCK 2048 /* elements per block of the fold: 16 KiB of float64 */
#define MAXR 256

/* ---- the fold ------------------------------------------------------------------------ */

typedef void (*fold_fn)(char *out, char *const *rows, int nr, Py_ssize_t m);

#define ADD(x, y) ((x) + (y))
#define MUL(x, y) ((x) * (y))
#define AND(x, y) ((x) & (y))
#define OR(x, y) ((x) | (y))
#define XOR(x, y) ((x) ^ (y))
#define IMIN(x, y) ((x) < (y) ? (x) : (y))
#define IMAX(x, y) ((x) > (y) ? (x) : (y))
/* floats: when an operand is a NaN the result is that NaN, quietened (the first if both),
 * as x86's addss/mulss give NumPy: written out, because the compiler may swap the
 * operands of a commutative op (x + x quietens x and keeps its payload). MIN/MAX as
 * NumPy: a NaN operand as it is (the first if both), of equal operands the second.
 * Every candidate is computed, then selected, so the loops vectorise (with
 * -fno-trapping-math: no FP exception is ever unmasked here). */
#define FLOAT_OPS(T, S)                                                                    \
    static inline T fadd_##S(T x, T y) {                                                   \
        T r = x + y, qx = x + x, qy = y + y;                                               \
        r = y != y ? qy : r;                                                               \
        return x != x ? qx : r;                                                            \
    }                                                                                      \
    static inline T fmul_##S(T x, T y) {                                                   \
        T r = x * y, qx = x + x, qy = y + y;                                               \
        r = y != y ? qy : r;                                                               \
        return x != x ? qx : r;                                                            \
    }                                                                                      \
    static inline T fmin_##S(T x, T y) {                                                   \
        T r = x < y ? x : y;                                                               \
        r = y != y ? y : r;                                                                \
        return x != x ? x : r;                                                             \
    }                                                                                      \
    static inline T fmax_##S(T x, T y) {                                                   \
        T r = x > y ? x : y;                                                               \
        r = y != y ? y : r;                                                                \
        return x != x ? x : r;                                                             \
    }
FLOAT_OPS(float, f32)
FLOAT_OPS(double, f64)

/* the fold loops in two builds chosen at load time where the compiler can (AVX2 and the
 * baseline): the same operations in the same order, only wider */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define WIDE __attribute__((target_clones("avx2", "default")))
#else
#define WIDE
#endif

/* T: the storage type, A: the type the op computes in (unsigned for wrapping integers) */
#define FOLD(NAME, T, A, OP)                                                              \
    WIDE static void NAME(char *out, char *const *rows, int nr, Py_ssize_t m) {           \
        T *restrict o = (T *)out;                                                          \
        for (Py_ssize_t lo = 0; lo < m; lo += BLOCK) {                                     \
            Py_ssize_t hi = lo + BLOCK < m ? lo + BLOCK : m;                               \
            const T *restrict a = (const T *)rows[0], *restrict b = (const T *)rows[1];    \
            for (Py_ssize_t i = lo; i < hi; i++)                                           \
                o[i] = (T)OP((A)a[i], (A)b[i]);                                            \
            for (int r = 2; r < nr; r++) {                                                 \
                const T *restrict c = (const T *)rows[r];                                  \
                for (Py_ssize_t i = lo; i < hi; i++)                                       \
                    o[i] = (T)OP((A)o[i], (A)c[i]);                                        \
            }                                                                              \
        }                                                                                  \
    }

#define INTS(OPN, OP)                                                                      \
    FOLD(OPN##_i8, int8_t, uint8_t, OP) FOLD(OPN##_u8, uint8_t, uint8_t, OP)               \
    FOLD(OPN##_i32, int32_t, uint32_t, OP) FOLD(OPN##_u32, uint32_t, uint32_t, OP)         \
    FOLD(OPN##_i64, int64_t, uint64_t, OP) FOLD(OPN##_u64, uint64_t, uint64_t, OP)
INTS(add, ADD)
INTS(mul, MUL)
INTS(and, AND)
INTS(or, OR)
INTS(xor, XOR)
/* comparisons in the signed types themselves */
FOLD(min_i8, int8_t, int8_t, IMIN) FOLD(min_u8, uint8_t, uint8_t, IMIN)
FOLD(min_i32, int32_t, int32_t, IMIN) FOLD(min_u32, uint32_t, uint32_t, IMIN)
FOLD(min_i64, int64_t, int64_t, IMIN) FOLD(min_u64, uint64_t, uint64_t, IMIN)
FOLD(max_i8, int8_t, int8_t, IMAX) FOLD(max_u8, uint8_t, uint8_t, IMAX)
FOLD(max_i32, int32_t, int32_t, IMAX) FOLD(max_u32, uint32_t, uint32_t, IMAX)
FOLD(max_i64, int64_t, int64_t, IMAX) FOLD(max_u64, uint64_t, uint64_t, IMAX)
FOLD(add_f32, float, float, fadd_f32) FOLD(mul_f32, float, float, fmul_f32)
FOLD(min_f32, float, float, fmin_f32) FOLD(max_f32, float, float, fmax_f32)
FOLD(add_f64, double, double, fadd_f64) FOLD(mul_f64, double, double, fmul_f64)
FOLD(min_f64, double, double, fmin_f64) FOLD(max_f64, double, double, fmax_f64)

static inline float bf16_in(uint16_t u) {
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

static inline uint16_t bf16_out(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* bfloat16: each op in float32, rounded back after every op (the Reducer's combine) */
#define FOLD_BF16(NAME, OP)                                                               \
    WIDE static void NAME(char *out, char *const *rows, int nr, Py_ssize_t m) {           \
        uint16_t *restrict o = (uint16_t *)out;                                            \
        const uint16_t *a = (const uint16_t *)rows[0], *b = (const uint16_t *)rows[1];     \
        for (Py_ssize_t i = 0; i < m; i++) {                                               \
            float x = bf16_in(a[i]), y = bf16_in(b[i]);                                    \
            o[i] = bf16_out(OP(x, y));                                                     \
        }                                                                                  \
        for (int r = 2; r < nr; r++) {                                                     \
            const uint16_t *c = (const uint16_t *)rows[r];                                 \
            for (Py_ssize_t i = 0; i < m; i++) {                                           \
                float x = bf16_in(o[i]), y = bf16_in(c[i]);                                \
                o[i] = bf16_out(OP(x, y));                                                 \
            }                                                                              \
        }                                                                                  \
    }
FOLD_BF16(add_bf16, fadd_f32)
FOLD_BF16(mul_bf16, fmul_f32)
FOLD_BF16(min_bf16, fmin_f32)
FOLD_BF16(max_bf16, fmax_f32)

static fold_fn pick(int dtype, int op) {
    static const fold_fn sum[D_COUNT] = {add_i8, add_u8, add_i32, add_u32, add_i64,
                                         add_u64, NULL, add_bf16, add_f32, add_f64};
    static const fold_fn prod[D_COUNT] = {mul_i8, mul_u8, mul_i32, mul_u32, mul_i64,
                                          mul_u64, NULL, mul_bf16, mul_f32, mul_f64};
    static const fold_fn mn[D_COUNT] = {min_i8, min_u8, min_i32, min_u32, min_i64,
                                        min_u64, NULL, min_bf16, min_f32, min_f64};
    static const fold_fn mx[D_COUNT] = {max_i8, max_u8, max_i32, max_u32, max_i64,
                                        max_u64, NULL, max_bf16, max_f32, max_f64};
    static const fold_fn band[D_COUNT] = {and_i8, and_u8, and_i32, and_u32, and_i64, and_u64};
    static const fold_fn bor[D_COUNT] = {or_i8, or_u8, or_i32, or_u32, or_i64, or_u64};
    static const fold_fn bxor[D_COUNT] = {xor_i8, xor_u8, xor_i32, xor_u32, xor_i64, xor_u64};
    if (dtype < 0 || dtype >= D_COUNT)
        return NULL;
    switch (op) {
    case O_SUM: case O_AVG: case O_PREMUL: return sum[dtype];
    case O_PROD: return prod[dtype];
    case O_MIN: return mn[dtype];
    case O_MAX: return mx[dtype];
    case O_BAND: return band[dtype];
    case O_BOR: return bor[dtype];
    case O_BXOR: return bxor[dtype];
    default: return NULL;
    }
}

/* ---- the Round object -------------------------------------------------------------- */

/* bytes from which a copy into the segment streams (copy_out), unless the round was
 * told otherwise (Round.stores: the store mode measured on the communicator) */
#define SHARE_NT 4096

typedef struct {
    PyObject_HEAD
    Py_buffer seg;
    char *base;
    int npeers, nrows, dtype, op;
    fold_fn fold;                      /* NULL: no fold (nothing to combine) */
    Py_ssize_t my_word[2];             /* this rank's seq word, by parity */
    Py_ssize_t mine_off[2];            /* byte offset of this rank's contribution */
    Py_ssize_t *peer_word[2];          /* the peers' seq words, by parity */
    Py_ssize_t *peer_sleep;            /* the peers' sleep-flag words */
    Py_ssize_t *row_off[2];            /* the rows to fold, in the Program's order */
    int64_t spin_ns, yield_ns;
    Py_ssize_t nbytes, row_bytes;      /* the largest contribution; a row's bytes */
    Py_ssize_t share_nt;               /* bytes from which copies into the segment stream */
    Py_ssize_t *place_off[2];          /* gather: output block b <- this offset (places) */
    int nplace, own;                   /* output blocks; the one that is ours (-1: none) */
    int srow;                          /* scatter: 1 + the fold row that is ours (0: unset) */
    Py_ssize_t skip_lo, skip_hi;       /* scatter: the bytes of the input no peer reads */
    uint64_t head[3];                  /* the call words for `hot` (set_head) */
    /* the flight recorder `hot` writes (record): its ring (a list), the call's Desc
     * template, the marks rows (seq, state, created, completed) and the counters
     * (entries made here, last enqueued, started, completed; entries Python made, read
     * here for the next slot); ringtree.prof.flight reads them */
    PyObject *fr_ring, *fr_desc;
    Py_buffer fr_marks, fr_ctr;
    Py_ssize_t fr_size;
    /* split (pair): the all-gather round of this reduce-scatter round and where this
     * rank's folded block goes, by parity (see split_body) */
    PyObject *pair;
    Py_ssize_t pair_dst[2];
    /* one rank (alone): every entry's bytes (-1: not alone) and PREMUL_SUM's scale */
    Py_ssize_t alone;
    int scaled;
    double fscale;
    uint64_t iscale;
    /* hot: the dtype object x must have (expect; NULL: any of the round's size) */
    PyObject *descr;
    /* registered buffers' agreement (reg_words): this rank's state line, the peers' (in
     * peer order), and the state-line words: the mark, input, output, header, announce */
    Py_ssize_t reg_state, *reg_peer, reg_w[5];
    struct DirectCall *dc;             /* the single copy's calls (direct, _direct.h) */
    PyObject *weakrefs;                /* a communicator's rounds are kept by weak refs */
} Round;
static void direct_free(struct DirectCall *d);

static inline volatile uint64_t *word(Round *k, Py_ssize_t i) {
    return (volatile uint64_t *)(k->base + 8 * i);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void unrecord(Round *k) {
    if (k->fr_ring == NULL)
        return;
    Py_CLEAR(k->fr_ring);
    Py_CLEAR(k->fr_desc);
    PyBuffer_Release(&k->fr_marks);
    PyBuffer_Release(&k->fr_ctr);
}

static int64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void Round_dealloc(Round *k) {
    if (k->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)k);
    unrecord(k);
    Py_CLEAR(k->pair);
    Py_CLEAR(k->descr);
    if (k->base != NULL)
        PyBuffer_Release(&k->seg);
    PyMem_Free(k->peer_word[0]);
    PyMem_Free(k->place_off[0]);
    PyMem_Free(k->reg_peer);
    direct_free(k->dc);
    PyObject_Free(k);
}

static int read_index_list(PyObject *seq, Py_ssize_t n, Py_ssize_t *dst, const char *what) {
    PyObject *f = PySequence_Fast(seq, what);
    if (f == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(f) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd entries", what, n);
        Py_DECREF(f);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        dst[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(f, i));
        if (dst[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(f);
            return -1;
        }
    }
    Py_DECREF(f);
    return 0;
}

/* Round(segment, my_words, mine_offs, peer_words0, peer_words1, peer_sleep, rows0, rows1,
 *       dtype, op, spin_ns, yield_ns, nbytes, row_bytes) */
static PyObject *Round_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *seg, *mw, *mo, *pw0, *pw1, *ps, *r0, *r1;
    int dtype, op;
    long long spin, yld;
    Py_ssize_t nbytes, row_bytes;
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Round takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOiiLLnn", &seg, &mw, &mo, &pw0, &pw1, &ps, &r0,
                          &r1, &dtype, &op, &spin, &yld, &nbytes, &row_bytes))
        return NULL;
    Py_ssize_t np_ = PySequence_Size(pw0), nr = PySequence_Size(r0);
    if (np_ < 0 || nr < 0)
        return NULL;
    if (np_ >= MAXR || nr > MAXR || (nr > 0 && nr < 2) || dtype < 0 || dtype >= D_COUNT) {
        PyErr_SetString(PyExc_ValueError, "Round: bad ranks, rows or dtype");
        return NULL;
    }
    fold_fn fold = NULL;
    if (nr > 0 && (fold = pick(dtype, op)) == NULL) {
        PyErr_Format(PyExc_ValueError, "Round: no fold for dtype %d op %d", dtype, op);
        return NULL;
    }
    Round *k = (Round *)type->tp_alloc(type, 0);
    if (k == NULL)
        return NULL;
    k->npeers = (int)np_, k->nrows = (int)nr, k->dtype = dtype, k->op = op, k->fold = fold;
    k->spin_ns = spin, k->yield_ns = yld, k->nbytes = nbytes, k->row_bytes = row_bytes;
    k->alone = -1, k->share_nt = SHARE_NT;
    Py_ssize_t *mem = PyMem_Calloc(3 * np_ + 2 * nr + 1, sizeof(Py_ssize_t));
    if (mem == NULL) {
        Py_DECREF(k);
        return PyErr_NoMemory();
    }
    k->peer_word[0] = mem, k->peer_word[1] = mem + np_, k->peer_sleep = mem + 2 * np_;
    k->row_off[0] = mem + 3 * np_, k->row_off[1] = mem + 3 * np_ + nr;
    if (read_index_list(mw, 2, k->my_word, "my_words") < 0 ||
        read_index_list(mo, 2, k->mine_off, "mine_offs") < 0 ||
        read_index_list(pw0, np_, k->peer_word[0], "peer_words0") < 0 ||
        read_index_list(pw1, np_, k->peer_word[1], "peer_words1") < 0 ||
        read_index_list(ps, np_, k->peer_sleep, "peer_sleep") < 0 ||
        read_index_list(r0, nr, k->row_off[0], "rows0") < 0 ||
        read_index_list(r1, nr, k->row_off[1], "rows1") < 0) {
        Py_DECREF(k);
        return NULL;
    }
    if (PyObject_GetBuffer(seg, &k->seg, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        Py_DECREF(k);
        return NULL;
    }
    k->base = k->seg.buf;
    return (PyObject *)k;
}

/* wait for every peer's parity-p line to show s, then compare its header with ours:
 * -1 all there and equal; i >= 0 peer i has not arrived within the budgets; -2 - i
 * peer i's header differs. The GIL is released by the caller. */
static int wait_peers(Round *k, int p, uint64_t s, int first) {
    Py_ssize_t me = k->my_word[p];
    uint64_t h0 = *word(k, me + 1), h1 = *word(k, me + 2), h2 = *word(k, me + 3);
    int64_t start = 0, spin_end = 0, end = 0;
    for (int i = first; i < k->npeers; i++) {
        Py_ssize_t j = k->peer_word[p][i];
        volatile uint64_t *w = word(k, j);
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) < s) {
            if (start == 0) {
                start = now_ns();
                spin_end = start + k->spin_ns, end = start + k->yield_ns;
                if (end < spin_end)
                    end = spin_end;
            }
            /* spin (a look per `pause`, the clock every 64) until spin_end, then give
             * the CPU away between looks (sched_yield) until end: with more ranks than
             * cores the peer we wait for may need this very core */
            unsigned n = 0;
            int yielding = now_ns() >= spin_end;
            while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < s) {
                if (yielding) {
                    sched_yield();
                    if (now_ns() >= end)
                        return i;
                    continue;
                }
                CPU_RELAX();
                if ((++n & 63) == 0) {
                    int64_t t = now_ns();
                    if (t >= end)
                        return i;
                    yielding = t >= spin_end;
                }
            }
        }
        if (*word(k, j + 1) != h0 || *word(k, j + 2) != h1 || *word(k, j + 3) != h2)
            return -2 - i;
    }
    return -1;
}

/* copy m bytes to memory this rank will not read again soon, with non-temporal stores
 * when `stream` (no read for ownership; the lines leave this core's caches), else with
 * memcpy. Used for an all-gather's output larger than the last-level cache (no eviction
 * of the cells the peers read), and for what this rank writes into the segment for its
 * peers from SHARE_NT bytes: a cell's lines were last read by the peers, so a cached
 * store must first take each line back from their caches, which cost more here than
 * the peers' reads from memory (docs/design-notes.md, "Streaming stores into the
 * segment"). The sfence orders them before the sequence word that publishes them. */
#define STREAM_MIN (8 << 20) /* output bytes from which a gather streams its stores */
static void copy_out(char *dst, const char *src, Py_ssize_t m, int stream) {
    if (stream)
        stream_copy(dst, src, (size_t)m);
    else
        cached_copy(dst, src, (size_t)m);
}

/* copy every byte of the input x (nbytes) but the skipped ones (the own block) into this
 * rank's area of parity p */
static void stage_others(Round *k, int p, const char *x) {
    char *mine = k->base + k->mine_off[p];
    copy_out(mine, x, k->skip_lo, k->skip_lo >= k->share_nt);
    copy_out(mine + k->skip_hi, x + k->skip_hi, k->nbytes - k->skip_hi,
             k->nbytes - k->skip_hi >= k->share_nt);
}

#define RING 1000000

/* publish this rank's line: the header, then the sequence word (a release store), a
 * full fence, the peers' sleep flags (Dekker with the sleeper). RING when a peer
 * sleeps (Python rings its doorbell, then calls wait), else -1. GIL released. */
static int publish(Round *k, int p, uint64_t s, const uint64_t h[3]) {
    Py_ssize_t me = k->my_word[p];
    *word(k, me + 1) = h[0];
    *word(k, me + 2) = h[1];
    *word(k, me + 3) = h[2];
    __atomic_store_n(word(k, me), s, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* our seq before their sleep flags */
    for (int i = 0; i < k->npeers; i++)
        if (*word(k, k->peer_sleep[i]))
            return RING;
    return -1;
}

/* publish, then wait for every peer: -1 when all are there with equal headers, else
 * publish's or wait_peers' code. GIL released. */
static int publish_wait(Round *k, int p, uint64_t s, const uint64_t h[3]) {
    int r = publish(k, p, s, h);
    return r == -1 ? wait_peers(k, p, s, 0) : r;
}

/* rows[i] <- row i of parity p, `skip` bytes in */
static void row_ptrs(Round *k, int p, Py_ssize_t skip, char **rows) {
    for (int i = 0; i < k->nrows; i++)
        rows[i] = k->base + k->row_off[p][i] + skip;
}

/* the call words at args[0..3]: s, h0, h1, h2. -1 with an exception set on bad ones */
static int call_words(PyObject *const *args, uint64_t *s, uint64_t h[3]) {
    *s = PyLong_AsUnsignedLongLong(args[0]);
    for (int i = 0; i < 3; i++)
        h[i] = PyLong_AsUnsignedLongLong(args[1 + i]);
    return PyErr_Occurred() ? -1 : 0;
}

/* copy the peers' m bytes of parity p (the places) to o + b * block, every block but
 * the own one. GIL released. */
static void place_peers(Round *k, int p, char *o, Py_ssize_t block, Py_ssize_t m) {
    for (int b = 0; b < k->nplace; b++)
        if (b != k->own)
            cached_copy(o + b * block, k->base + k->place_off[p][b], (size_t)m);
}

/* x (C-contiguous) and out (C-contiguous, writable) as buffers: -1 with an exception
 * set (nothing held) or 0 (both held: release2) */
static int two_buffers(PyObject *x, PyObject *out, Py_buffer *xb, Py_buffer *ob) {
    if (take_buffer(x, xb, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (take_buffer(out, ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(xb);
        return -1;
    }
    return 0;
}

static void release2(Py_buffer *xb, Py_buffer *ob) {
    PyBuffer_Release(xb);
    PyBuffer_Release(ob);
}

/* a ValueError `msg` after two_buffers: both released, NULL for the caller to return */
static PyObject *misfit(Py_buffer *xb, Py_buffer *ob, const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    release2(xb, ob);
    return NULL;
}

#define TILE 8192 /* bytes of a fold made in L1, then copied (or streamed) out */

/* a fold round whose contribution x was streamed into the segment (so its lines left
 * this core's caches): fold the rows into out with this rank's own row, if one is a
 * part of its contribution, read from x (the same bytes, still cached) a tile at a
 * time into L1, each tile then copied to out (which may be x). 0: no own row to read */
static int own_row(Round *k, int p, Py_ssize_t xlen, Py_ssize_t olen) {
    for (int i = 0; i < k->nrows; i++) {
        Py_ssize_t d = k->row_off[p][i] - k->mine_off[p];
        if (d >= 0 && d + olen <= xlen)  /* rows lie in their ranks' disjoint areas */
            return i;
    }
    return -1;
}

static int fold_own(Round *k, int p, const char *x, Py_ssize_t xlen, char *out,
                    Py_ssize_t olen) {
    int own = own_row(k, p, xlen, olen);
    if (own < 0)
        return 0;
    const char *mine = x + (k->row_off[p][own] - k->mine_off[p]);
    char *rows[MAXR];
    char tile[TILE] __attribute__((aligned(64)));
    Py_ssize_t item = ITEMSIZE[k->dtype];
    for (Py_ssize_t t = 0; t < olen; t += TILE) {
        Py_ssize_t m = olen - t < TILE ? olen - t : TILE;
        row_ptrs(k, p, t, rows);
        rows[own] = (char *)mine + t;
        k->fold(tile, rows, k->nrows, m / item);
        cached_copy(out + t, tile, (size_t)m);
    }
    return 1;
}

/* one round, the GIL released by the caller: copy `x` (NULL: nothing) into this rank's
 * area, publish, wait for every peer, fold into `out` (NULL: no fold). Round_run's
 * codes. */
static int round_body(Round *k, int p, uint64_t s, const uint64_t h[3], const void *x,
                      Py_ssize_t xlen, void *out, Py_ssize_t olen) {
    int streamed = x != NULL && xlen >= k->share_nt;
    if (x != NULL)
        copy_out(k->base + k->mine_off[p], x, xlen, streamed);
    int r = publish_wait(k, p, s, h);
    if (r == -1 && out != NULL && k->fold != NULL) {
        if (streamed && fold_own(k, p, x, xlen, out, olen))
            return r;
        char *rows[MAXR];
        row_ptrs(k, p, 0, rows);
        k->fold(out, rows, k->nrows, olen / ITEMSIZE[k->dtype]);
    }
    return r;
}

/* run(x, out, s, h0, h1, h2) -> int
 * x: the contribution (None: already in place, or nothing to send); out: where the
 * fold goes (None: no fold). Returns -1 when the call is complete (folded),
 * -2 - i on a header mismatch with peer i, i >= 0 when peer i had not arrived within
 * the budgets (Python waits on, then calls fold), RING (a large value) when a peer
 * sleeps: Python rings, then calls wait. */
static PyObject *Round_run(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "run(x, out, s, h0, h1, h2)");
        return NULL;
    }
    uint64_t s, h[3];
    if (call_words(args + 2, &s, h) < 0)
        return NULL;
    int p = (int)(s & 1);
    Py_buffer xb, ob;
    int have_x = args[0] != Py_None, have_o = args[1] != Py_None;
    if (have_x && take_buffer(args[0], &xb, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (have_o && take_buffer(args[1], &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        if (have_x)
            PyBuffer_Release(&xb);
        return NULL;
    }
    if ((have_x && xb.len > k->nbytes) ||
        (have_o && k->fold != NULL && (ob.len > k->row_bytes || ob.len % ITEMSIZE[k->dtype]))) {
        PyErr_SetString(PyExc_ValueError, "run: the contribution or the output does not fit");
        if (have_x)
            PyBuffer_Release(&xb);
        if (have_o)
            PyBuffer_Release(&ob);
        return NULL;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = round_body(k, p, s, h, have_x ? xb.buf : NULL, have_x ? xb.len : 0,
                   have_o ? ob.buf : NULL, have_o ? ob.len : 0);
    Py_END_ALLOW_THREADS
    if (have_x)
        PyBuffer_Release(&xb);
    if (have_o)
        PyBuffer_Release(&ob);
    return PyLong_FromLong(r);
}

/* same_shape(a, b): two buffers (PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) of one dtype and
 * shape whose memory does not overlap */
static int same_shape(const Py_buffer *a, const Py_buffer *b) {
    if (a->ndim != b->ndim || a->len != b->len || a->itemsize != b->itemsize ||
        strcmp(a->format ? a->format : "B", b->format ? b->format : "B") != 0)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    const char *x = a->buf, *o = b->buf;
    return x + a->len <= o || o + b->len <= x;
}

/* the flight recorder's entry for call `seq` (bound by record), started now: its marks
 * row, NULL when no recorder is bound (or its ring was resized) */
static int64_t *fr_start(Round *k, long long seq) {
    if (k->fr_ring == NULL || PyList_GET_SIZE(k->fr_ring) != k->fr_size)
        return NULL;
    int64_t *ctr = (int64_t *)k->fr_ctr.buf;  /* ctr[4]: the entries Python made */
    Py_ssize_t i = (Py_ssize_t)((ctr[4] + ctr[0]) % k->fr_size);
    PyObject *old = PyList_GET_ITEM(k->fr_ring, i);
    Py_INCREF(k->fr_desc);
    PyList_SET_ITEM(k->fr_ring, i, k->fr_desc);
    int64_t *mark = (int64_t *)k->fr_marks.buf + 4 * i;
    mark[0] = seq, mark[1] = 1, mark[2] = real_ns(), mark[3] = 0;
    ctr[0] += 1, ctr[1] = ctr[2] = seq;
    Py_XDECREF(old);
    return mark;
}

/* call `seq`'s entry (fr_start's mark, NULL: none) completed now */
static void fr_done(Round *k, int64_t *mark, long long seq) {
    if (mark != NULL)
        mark[1] = 2, mark[3] = real_ns(), ((int64_t *)k->fr_ctr.buf)[3] = seq;
}

/* an entry's end: its buffers released (ob NULL: none, in place), call `seq`'s entry
 * completed if the call was (r == -1); the code, as a Python int */
static PyObject *entry_end(Round *k, Py_buffer *xb, Py_buffer *ob, int64_t *mark,
                           long long seq, int r) {
    PyBuffer_Release(xb);
    if (ob != NULL)
        PyBuffer_Release(ob);
    if (r == -1)
        fr_done(k, mark, seq);
    return PyLong_FromLong(r);
}

/* ---- one rank: no segment, no peers ------------------------------------------------
 * A communicator of one rank folds only its own contribution: every entry (hot, rhot,
 * ghot, shot, bshot) of a Round set alone() checks its buffers as it does for a real
 * round, writes the flight recorder's entry and copies x into out when out is not x,
 * or writes scale * x (PREMUL_SUM's pre-op, as Reducer.premultiply: one IEEE multiply
 * in the dtype, NaNs as fmul; integers wrap); AVG is x / 1, the same bits. */
#define SCALE(T, U, V)                                                                     \
    for (Py_ssize_t i = 0; i < m / (Py_ssize_t)sizeof(T); i++)                             \
        ((T *)out)[i] = (T)(U)((U)((const T *)x)[i] * (U)(V));
static void alone_body(Round *k, const char *x, char *out, Py_ssize_t m) {
    if (!k->scaled) {
        if (out != x)  /* from STREAM_MIN streamed: 1.5-1.9x memcpy's speed at 8-32 MiB */
            copy_out(out, x, m, m >= STREAM_MIN);
        return;
    }
    float f = (float)k->fscale;
    double d = k->fscale;
    switch (k->dtype) {
    case D_FLOAT32:
        for (Py_ssize_t i = 0; i < m / 4; i++)
            ((float *)out)[i] = fmul_f32(((const float *)x)[i], f);
        break;
    case D_FLOAT64:
        for (Py_ssize_t i = 0; i < m / 8; i++)
            ((double *)out)[i] = fmul_f64(((const double *)x)[i], d);
        break;
    case D_INT8: SCALE(int8_t, uint8_t, k->iscale) break;
    case D_UINT8: SCALE(uint8_t, uint8_t, k->iscale) break;
    case D_INT32: SCALE(int32_t, uint32_t, k->iscale) break;
    case D_UINT32: SCALE(uint32_t, uint32_t, k->iscale) break;
    case D_INT64: SCALE(int64_t, uint64_t, k->iscale) break;
    case D_UINT64: SCALE(uint64_t, uint64_t, k->iscale) break;
    default: break; /* alone() refuses a scale for float16 and bfloat16 */
    }
}

#define NOBUF (-RING)           /* an entry's answer: not its buffers, nothing done */
#define ALONE_NOGIL (256 << 10) /* bytes from which the copy releases the GIL */
/* an entry of a Round set alone(): x (and out: NULL, in place) held; `fits` the entry's
 * check of their shapes. NOBUF (nothing done) or -1 (done, recorded as call `seq`) */
static PyObject *alone_entry(Round *k, Py_buffer *xb, Py_buffer *ob, int fits,
                             long long seq) {
    char *out = ob != NULL ? ob->buf : xb->buf;
    fits = fits && xb->len == k->alone;
    if (fits) {
        int64_t *mark = fr_start(k, seq);
        if (out == xb->buf && !k->scaled) {
            /* in place, nothing to scale: nothing to do (not even the GIL's release) */
        } else if (xb->len >= ALONE_NOGIL) {
            Py_BEGIN_ALLOW_THREADS
            alone_body(k, xb->buf, out, xb->len);
            Py_END_ALLOW_THREADS
        } else {
            alone_body(k, xb->buf, out, xb->len);
        }
        fr_done(k, mark, seq);
    }
    PyBuffer_Release(xb);
    if (ob != NULL)
        PyBuffer_Release(ob);
    return PyLong_FromLong(fits ? -1 : NOBUF);
}

/* alone(nbytes, scale) -> None: this Round is one rank's (see alone_entry): calls of
 * nbytes; scale None, or PREMUL_SUM's (a float for float32/float64, an int already in
 * the integer dtype's range) */
static PyObject *Round_alone(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "alone(nbytes, scale)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "alone: nbytes < 0");
        return NULL;
    }
    int scaled = args[1] != Py_None;
    if (scaled && (k->dtype == D_FLOAT16 || k->dtype == D_BFLOAT16)) {
        PyErr_SetString(PyExc_ValueError, "alone: no scale for float16 or bfloat16");
        return NULL;
    }
    if (scaled && (k->dtype == D_FLOAT32 || k->dtype == D_FLOAT64)) {
        double d = PyFloat_AsDouble(args[1]);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        k->fscale = d;
    } else if (scaled) {
        long long v = PyLong_AsLongLong(args[1]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = (long long)PyLong_AsUnsignedLongLong(args[1]);
            if (PyErr_Occurred())
                return NULL;
        }
        k->iscale = (uint64_t)v;
    }
    k->alone = n, k->scaled = scaled;
    Py_RETURN_NONE;
}

/* hot(x, out, s, seq) -> int: Round_run(x, out, s, head with s) (a paired round:
 * split(), calls s and s + 1) for a call of exactly the round's size (out None or x: in place; else an array of x's dtype and shape that does
 * not overlap it), the header from set_head, recorded as collective `seq` in the flight
 * recorder (if bound): the all-reduce hot path in one entry. NOBUF when the arrays are
 * not that (not C-contiguous, not writable, another size or shape, overlapping): nothing
 * was done, the caller takes the general path. Otherwise Round_run's codes (not -1:
 * the entry stays started, the caller completes the wait and the entry,
 * FlightRecorder.end_native). */
static int split_body(Round *k, uint64_t s, const uint64_t h[3], const char *x, char *out);
static int root_body(Round *k, int p, uint64_t s, const uint64_t h[3], const char *x,
                     Py_ssize_t len, char *out);
/* the call words of a one-entry call (x, out, s, seq): 0, or -1 with an exception (a
 * wrong count: TypeError naming `usage`; words that are not integers) */
static int entry_words(const char *usage, PyObject *const *args, Py_ssize_t nargs,
                       uint64_t *s, long long *seq) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *s = PyLong_AsUnsignedLongLong(args[2]);
    *seq = PyLong_AsLongLong(args[3]);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *hot_entry(Round *k, PyObject *const *args, Py_ssize_t nargs, int unread) {
    uint64_t s;
    long long seq;
    if (entry_words(unread ? "rhot(x, out, s, seq)" : "hot(x, out, s, seq)", args, nargs,
                    &s, &seq) < 0)
        return NULL;
    int inplace = args[1] == Py_None || args[1] == args[0];
    Py_buffer xb, ob;
    if (take_buffer(args[0], &xb, inplace ? PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE
                                                 : PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(NOBUF);
    }
    if (!inplace &&
        take_buffer(args[1], &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&xb);
        return PyLong_FromLong(NOBUF);
    }
    if (k->descr != NULL && !has_descr(args[0], k->descr)) {
        PyBuffer_Release(&xb);
        if (!inplace)
            PyBuffer_Release(&ob);
        return PyLong_FromLong(NOBUF);
    }
    if (k->alone >= 0)
        return alone_entry(k, &xb, inplace ? NULL : &ob, inplace || same_shape(&xb, &ob), seq);
    if (k->fold == NULL || xb.len != (k->pair ? k->nbytes : k->row_bytes) ||
        xb.len > k->nbytes || (!inplace && !same_shape(&xb, &ob))) {
        PyBuffer_Release(&xb);
        if (!inplace)
            PyBuffer_Release(&ob);
        return PyLong_FromLong(NOBUF);
    }
    void *out = inplace ? xb.buf : ob.buf;
    int64_t *mark = fr_start(k, seq);
    const uint64_t h[3] = {k->head[0], k->head[1] | (s & 0xFFFFFFFFu), k->head[2]};
    int r;
    Py_BEGIN_ALLOW_THREADS
    if (k->pair != NULL)
        r = split_body(k, s, h, xb.buf, out);
    else if (unread)
        r = root_body(k, (int)(s & 1), s, h, xb.buf, xb.len, out);
    else
        r = round_body(k, (int)(s & 1), s, h, xb.buf, xb.len, out, xb.len);
    Py_END_ALLOW_THREADS
    return entry_end(k, &xb, inplace ? NULL : &ob, mark, seq, r);
}

/* hot(x, out, s, seq, ident): first the issuing thread's check, ident being its owner's
 * threading.get_ident() (0: any thread), which Python's call of get_ident and compare of
 * two large ints made cost ~0.1 µs: NOTMINE (nothing done) from another thread */
#define NOTMINE (-RING - 1)
/* an entry's optional fifth argument, ident: 0 (none, or this thread's: *nargs becomes
 * 4), 1 (another thread's) or -1 (an exception) */
static int not_mine(PyObject *const *args, Py_ssize_t *nargs) {
    if (*nargs != 5)
        return 0;
    unsigned long long id = PyLong_AsUnsignedLongLong(args[4]);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *nargs = 4;
    return id != 0 && id != (unsigned long long)PyThread_get_thread_ident();
}

static PyObject *Round_hot(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    int other = not_mine(args, &nargs);
    if (other)
        return other < 0 ? NULL : PyLong_FromLong(NOTMINE);
    return hot_entry(k, args, nargs, 0);
}

/* expect(dtype) -> None: hot's x must have this dtype object (None: any), so that the
 * caller's per-call check of the dtype and size is the entry's (NOBUF otherwise) */
static PyObject *Round_expect(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "expect(dtype)");
        return NULL;
    }
    PyObject *d = args[0] == Py_None ? NULL : args[0];
    Py_XINCREF(d);
    Py_XSETREF(k->descr, d);
    Py_RETURN_NONE;
}

/* record(ring, marks, ctr, desc) -> None: bind the flight recorder hot writes (ring
 * None: none); ctr: the recorder's five counters (ringtree.prof.flight) */
static PyObject *Round_record(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record(ring, marks, ctr, desc)");
        return NULL;
    }
    unrecord(k);
    if (args[0] == Py_None)
        Py_RETURN_NONE;
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "record: ring must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    if (PyObject_GetBuffer(args[1], &k->fr_marks, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &k->fr_ctr, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&k->fr_marks);
        return NULL;
    }
    if (n < 1 || k->fr_marks.len != n * 4 * 8 || k->fr_ctr.len != 5 * 8) {
        PyBuffer_Release(&k->fr_marks);
        PyBuffer_Release(&k->fr_ctr);
        PyErr_SetString(PyExc_ValueError, "record: marks must be (len(ring), 4) int64 and "
                                          "ctr 5 int64");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[3]);
    k->fr_ring = args[0], k->fr_desc = args[3], k->fr_size = n;
    Py_RETURN_NONE;
}

/* set_head(h0, h1, h2) -> None: the call words `hot` publishes (h1 without the
 * sequence number) */
static PyObject *Round_set_head(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_head(h0, h1, h2)");
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        k->head[i] = PyLong_AsUnsignedLongLong(args[i]);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* wait(s, first) -> int: wait_peers from peer index `first` on (after a ring, or after
 * Python slept for one peer) */
static PyObject *Round_wait(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(s, first)");
        return NULL;
    }
    uint64_t s = PyLong_AsUnsignedLongLong(args[0]);
    long first = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (first < 0 || first > k->npeers) {
        PyErr_SetString(PyExc_ValueError, "wait: bad peer index");
        return NULL;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = wait_peers(k, (int)(s & 1), s, (int)first);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

/* fold(out, parity[, skip_bytes]) -> None: out = the rows of `parity` folded, starting
 * skip_bytes into each row (one part of a streamed call) */
static PyObject *Round_fold(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "fold(out, parity[, skip_bytes])");
        return NULL;
    }
    long p = PyLong_AsLong(args[1]);
    Py_ssize_t skip = nargs == 3 ? PyLong_AsSsize_t(args[2]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (k->fold == NULL || p < 0 || p > 1 || skip < 0) {
        PyErr_SetString(PyExc_ValueError, "fold: nothing to fold, or a bad parity");
        return NULL;
    }
    Py_buffer ob;
    if (PyObject_GetBuffer(args[0], &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (skip + ob.len > k->row_bytes || ob.len % ITEMSIZE[k->dtype]) {
        PyErr_SetString(PyExc_ValueError, "fold: the output does not fit the rows");
        PyBuffer_Release(&ob);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    char *rows[MAXR];
    row_ptrs(k, (int)p, skip, rows);
    k->fold(ob.buf, rows, k->nrows, ob.len / ITEMSIZE[k->dtype]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    Py_RETURN_NONE;
}

/* ---- a place round: all-gather ------------------------------------------------------
 * Every output block is one rank's contribution, copied whole. The kernel copies this
 * rank's own block straight from its input while the peers write theirs (after
 * publishing, before waiting), then each peer's block out of the segment once it is
 * there: the fewest passes a staged copy allows (each contribution written into the
 * segment once, read once per reader). */

/* places(rows0, rows1, own) -> None: output block b comes from byte offset rows<p>[b]
 * of the segment; `own` is this rank's block (copied from its input), -1: none */
static PyObject *Round_places(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "places(rows0, rows1, own)");
        return NULL;
    }
    Py_ssize_t nb = PySequence_Size(args[0]);
    long own = PyLong_AsLong(args[2]);
    if (nb < 0 || (own == -1 && PyErr_Occurred()))
        return NULL;
    if (nb < 1 || nb > MAXR || own < -1 || own >= nb) {
        PyErr_SetString(PyExc_ValueError, "places: bad blocks or own block");
        return NULL;
    }
    Py_ssize_t *mem = PyMem_Calloc(2 * nb, sizeof(Py_ssize_t));
    if (mem == NULL)
        return PyErr_NoMemory();
    if (read_index_list(args[0], nb, mem, "rows0") < 0 ||
        read_index_list(args[1], nb, mem + nb, "rows1") < 0) {
        PyMem_Free(mem);
        return NULL;
    }
    for (Py_ssize_t b = 0; b < 2 * nb; b++)
        if (mem[b] < 0 || mem[b] + k->nbytes > k->seg.len) {
            PyMem_Free(mem);
            PyErr_SetString(PyExc_ValueError, "places: a block past the segment");
            return NULL;
        }
    PyMem_Free(k->place_off[0]);
    k->place_off[0] = mem, k->place_off[1] = mem + nb;
    k->nplace = (int)nb, k->own = (int)own;
    Py_RETURN_NONE;
}

/* one part of an all-gather, the GIL released by the caller: x (m bytes) copied into
 * this rank's area (streamed from SHARE_NT bytes) and published, its own output block's
 * part copied from x while the peers write theirs, the peers waited for and their parts
 * copied to o + b * block (o: the output at the part's offset). Round_run's codes; not
 * -1: the peers' parts are not placed (nor, after RING, the own one). */
static int gather_body(Round *k, uint64_t s, const uint64_t h[3], const char *x,
                       Py_ssize_t m, char *o, Py_ssize_t block) {
    int p = (int)(s & 1);
    copy_out(k->base + k->mine_off[p], x, m, m >= k->share_nt);
    int r = publish(k, p, s, h);
    int stream = (Py_ssize_t)k->nplace * block >= STREAM_MIN;
    if (r == -1) {
        if (k->own >= 0 && o + k->own * block != x)
            copy_out(o + k->own * block, x, m, stream);
        r = wait_peers(k, p, s, 0);
    }
    if (r == -1)
        place_peers(k, p, o, block, m);
    return r;
}

/* gather(x, out, s, h0, h1, h2, off, block_bytes) -> int: x (this rank's part, at most
 * a contribution) written and published; its own output block's part copied from x;
 * the peers waited for; their parts copied: out + b * block_bytes + off <- block b's
 * contribution, len(x) bytes each. Returns as run() does; when not -1, the output is
 * not (wholly) written: Python finishes the wait and places every block itself. */
static PyObject *Round_gather(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "gather(x, out, s, h0, h1, h2, off, block_bytes)");
        return NULL;
    }
    uint64_t s, h[3];
    Py_ssize_t off = PyLong_AsSsize_t(args[6]), block = PyLong_AsSsize_t(args[7]);
    if (call_words(args + 2, &s, h) < 0)
        return NULL;
    if (k->place_off[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "gather: no places set");
        return NULL;
    }
    Py_buffer xb, ob;
    if (two_buffers(args[0], args[1], &xb, &ob) < 0)
        return NULL;
    if (xb.len > k->nbytes || off < 0 || block < 0 || off + xb.len > block ||
        (Py_ssize_t)k->nplace * block > ob.len)
        return misfit(&xb, &ob, "gather: the part or the output does not fit");
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = gather_body(k, s, h, xb.buf, xb.len, (char *)ob.buf + off, block);
    Py_END_ALLOW_THREADS
    release2(&xb, &ob);
    return PyLong_FromLong(r);
}

/* the arguments (x, out, s, seq) of ghot and shot: x and out as C-contiguous buffers
 * of one format (out writable) whose memory does not overlap, but for x exactly out's
 * block `own` or out exactly x's (own >= 0: an all-gather or a reduce-scatter in place,
 * as nccl-tests' and FSDP's: the gather's own block is then not copied and its peers'
 * blocks miss x; the scatter's own row is folded through a tile). 0: both held (release2);
 * 1: not such buffers (nothing held: NOBUF); -1: an exception (bad call words) */
static int hot_args(const char *usage, PyObject *const *args, Py_ssize_t nargs,
                    uint64_t *s, long long *seq, Py_buffer *xb, Py_buffer *ob,
                    Py_ssize_t own) {
    if (entry_words(usage, args, nargs, s, seq) < 0)
        return -1;
    if (take_buffer(args[0], xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 1;
    }
    if (take_buffer(args[1], ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(xb);
        return 1;
    }
    const char *x = xb->buf, *o = ob->buf;
    int in_place = own >= 0 && ((x == o + own * xb->len && x + xb->len <= o + ob->len) ||
                                (o == x + own * ob->len && o + ob->len <= x + xb->len));
    if (xb->itemsize != ob->itemsize ||
        strcmp(xb->format ? xb->format : "B", ob->format ? ob->format : "B") != 0 ||
        !(x + xb->len <= o || o + ob->len <= x || in_place)) {
        release2(xb, ob);
        return 1;
    }
    return 0;
}

/* ghot(x, out, s, seq) -> int: the all-gather's one C entry (gather_now): gather(x, out,
 * s, head with s, 0, len(x)) for a call whose output is the places' blocks of len(x)
 * bytes each (out: x's format, not overlapping it but where x is out's own block), the
 * header from set_head, recorded
 * as collective `seq` as hot() records. NOBUF when the arrays are not that (nothing was
 * done: the caller takes the general path); otherwise gather()'s codes (not -1: the
 * entry stays started, the caller places the blocks and completes it). */
static PyObject *blocks_entry(Round *k, PyObject *const *args, Py_ssize_t nargs,
                              int scatter);
static PyObject *Round_ghot(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    return blocks_entry(k, args, nargs, 0);
}

/* ---- a fold round that reads its own block in place: reduce-scatter ------------------
 * A rank's peers read every block of its input but the one it folds itself; that block
 * is neither copied into the segment nor read back from it: the fold reads it from the
 * input, in the same place of the same order, so the bits are the same. */

/* skips(row, lo, hi) -> None: fold row `row` is this rank's own, bytes [lo, hi) of its
 * input, which the peers do not read */
static PyObject *Round_skips(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "skips(row, lo, hi)");
        return NULL;
    }
    long row = PyLong_AsLong(args[0]);
    Py_ssize_t lo = PyLong_AsSsize_t(args[1]), hi = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (k->fold == NULL || row < 0 || row >= k->nrows || lo < 0 || hi < lo ||
        hi > k->nbytes || hi - lo != k->row_bytes) {
        PyErr_SetString(PyExc_ValueError, "skips: bad row or bytes");
        return NULL;
    }
    k->srow = (int)row + 1, k->skip_lo = lo, k->skip_hi = hi;
    Py_RETURN_NONE;
}

/* a reduce-scatter's round, the GIL released by the caller: x (nbytes) but its skipped
 * bytes (all of it when `staged`) copied into this rank's area, published, the peers
 * waited for, the rows folded into out (row_bytes) with the own row read from x (from
 * the segment when staged). Round_run's codes; not -1: out is not written, and unless
 * staged the own block is not in the segment. */
static void reg_fold(fold_fn f, int item, char *const *rows, int nr, char *dst,
                     Py_ssize_t len);
static int scatter_body(Round *k, uint64_t s, const uint64_t h[3], const char *x,
                        char *out, int staged) {
    int p = (int)(s & 1);
    if (staged)
        copy_out(k->base + k->mine_off[p], x, k->nbytes, k->nbytes >= k->share_nt);
    else
        stage_others(k, p, x);
    int r = publish_wait(k, p, s, h);
    if (r == -1) {
        char *rows[MAXR];
        row_ptrs(k, p, 0, rows);
        if (!staged)
            rows[k->srow - 1] = (char *)x + k->skip_lo;
        if (out == x + k->skip_lo)  /* in place: the own row read before out is written */
            reg_fold(k->fold, ITEMSIZE[k->dtype], rows, k->nrows, out, k->row_bytes);
        else
            k->fold(out, rows, k->nrows, k->row_bytes / ITEMSIZE[k->dtype]);
    }
    return r;
}

/* scatter(x, out, s, h0, h1, h2) -> int: run() without copying the skipped bytes of x
 * into the segment, folding them from x. When not -1 (a peer slept or came late) out is
 * not written: Python writes the skipped bytes into the segment, finishes the wait and
 * folds with fold(). */
static PyObject *Round_scatter(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scatter(x, out, s, h0, h1, h2)");
        return NULL;
    }
    uint64_t s, h[3];
    if (call_words(args + 2, &s, h) < 0)
        return NULL;
    if (k->srow == 0) {
        PyErr_SetString(PyExc_ValueError, "scatter: no skips set");
        return NULL;
    }
    Py_buffer xb, ob;
    if (two_buffers(args[0], args[1], &xb, &ob) < 0)
        return NULL;
    if (xb.len != k->nbytes || ob.len != k->row_bytes)
        return misfit(&xb, &ob, "scatter: the input or the output does not fit");
    const char *x = (const char *)xb.buf, *o = (const char *)ob.buf;
    /* in place (out is the own block of x): the fold would overwrite what it still reads,
     * so the own block is staged and read from the segment as run() does */
    int staged = o < x + k->skip_hi && x + k->skip_lo < o + ob.len, r;
    Py_BEGIN_ALLOW_THREADS
    r = scatter_body(k, s, h, x, ob.buf, staged);
    Py_END_ALLOW_THREADS
    release2(&xb, &ob);
    return PyLong_FromLong(r);
}

/* shot(x, out, s, seq) -> int: the reduce-scatter's one C entry (scatter_now):
 * scatter(x, out, s, head with s) for x of the round's nbytes and out of its row_bytes
 * (x's format, not overlapping it: the own block is read from x), the header from
 * set_head, recorded as collective `seq` as hot() records. NOBUF when the arrays are
 * not that (nothing was done: the caller takes the general path); otherwise scatter()'s
 * codes (not -1: the entry stays started; the caller writes the own block into the
 * segment, completes the wait, folds and completes the entry). */
static PyObject *Round_shot(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    return blocks_entry(k, args, nargs, 1);
}

/* ghot (scatter 0) and shot (scatter 1) */
static PyObject *blocks_entry(Round *k, PyObject *const *args, Py_ssize_t nargs,
                              int scatter) {
    uint64_t s;
    long long seq;
    Py_buffer xb, ob;
    /* the block that may alias in place: one rank's only block, the gather's own place,
     * the scatter's own row (its input's skipped bytes) */
    Py_ssize_t own = k->alone >= 0 ? 0 : !scatter ? k->own : -1;
    if (scatter && k->alone < 0 && k->row_bytes > 0)
        own = k->skip_lo / k->row_bytes;
    int a = hot_args(scatter ? "shot(x, out, s, seq)" : "ghot(x, out, s, seq)", args, nargs,
                     &s, &seq, &xb, &ob, own);
    if (a != 0)
        return a < 0 ? NULL : PyLong_FromLong(NOBUF);
    if (k->alone >= 0)  /* one block: out is x's copy */
        return alone_entry(k, &xb, &ob, ob.len == xb.len, seq);
    int fits = scatter ? k->srow != 0 && k->fold != NULL && xb.len == k->nbytes &&
                             ob.len == k->row_bytes
                       : k->place_off[0] != NULL && xb.len <= k->nbytes &&
                             ob.len == (Py_ssize_t)k->nplace * xb.len;
    if (!fits) {
        release2(&xb, &ob);
        return PyLong_FromLong(NOBUF);
    }
    int64_t *mark = fr_start(k, seq);
    const uint64_t h[3] = {k->head[0], k->head[1] | (s & 0xFFFFFFFFu), k->head[2]};
    int r;
    Py_BEGIN_ALLOW_THREADS
    if (scatter)
        r = scatter_body(k, s, h, xb.buf, ob.buf, 0);
    else
        r = gather_body(k, s, h, xb.buf, xb.len, ob.buf, xb.len);
    Py_END_ALLOW_THREADS
    release2(&xb, &ob);
    if (r == -1)
        fr_done(k, mark, seq);
    return PyLong_FromLong(r);
}

/* ---- a broadcast in one entry ------------------------------------------------------ */

/* bshot(x, out, s, seq) -> int: an in-place broadcast's one C entry (broadcast_now): the
 * root (no places set) copies x into its area (streamed from SHARE_NT bytes) and
 * publishes; every other rank (places: the root's contribution, own -1) publishes,
 * waits and copies the root's bytes into x. x: C-contiguous, writable, the round's
 * row_bytes; out: None or x. The header from set_head, recorded as collective `seq` as
 * hot() records. NOBUF when x is not that (nothing was done: the general path);
 * otherwise run()'s codes (not -1: the entry stays started; a rank but the root
 * copies the root's bytes after completing the wait). */
static PyObject *Round_bshot(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t s;
    long long seq;
    if (entry_words("bshot(x, out, s, seq)", args, nargs, &s, &seq) < 0)
        return NULL;
    Py_buffer xb;
    if ((args[1] != Py_None && args[1] != args[0]) ||
        take_buffer(args[0], &xb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(NOBUF);
    }
    if (k->alone >= 0)  /* the root's x, as it is */
        return alone_entry(k, &xb, NULL, 1, seq);
    int root = k->nplace == 0;
    if (xb.len != k->row_bytes || (root ? xb.len > k->nbytes : k->nplace != 1 || k->own != -1)) {
        PyBuffer_Release(&xb);
        return PyLong_FromLong(NOBUF);
    }
    int64_t *mark = fr_start(k, seq);
    const uint64_t h[3] = {k->head[0], k->head[1] | (s & 0xFFFFFFFFu), k->head[2]};
    int p = (int)(s & 1), r;
    char *x = xb.buf;
    Py_BEGIN_ALLOW_THREADS
    if (root)
        copy_out(k->base + k->mine_off[p], x, xb.len, xb.len >= k->share_nt);
    r = publish_wait(k, p, s, h);
    if (r == -1 && !root)
        cached_copy(x, k->base + k->place_off[p][0], (size_t)xb.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&xb);
    if (r == -1)
        fr_done(k, mark, seq);
    return PyLong_FromLong(r);
}

/* ---- a reduce in one entry ---------------------------------------------------------- */

/* the root of a reduce, the GIL released by the caller: no peer reads its contribution,
 * so it is not copied into the segment; publish, wait, fold the rows with its own read
 * from x (fold_own: the same operands in the same order, a tile at a time, so out may
 * be x). Round_run's codes; not -1: out is not written and the own row is not in the
 * segment (the caller writes it there, then folds). Without an own row: round_body. */
static int root_body(Round *k, int p, uint64_t s, const uint64_t h[3], const char *x,
                     Py_ssize_t len, char *out) {
    if (own_row(k, p, len, len) < 0)
        return round_body(k, p, s, h, x, len, out, len);
    int r = publish_wait(k, p, s, h);
    if (r == -1)
        fold_own(k, p, x, len, out, len);
    return r;
}

/* rhot(x, out, s, seq) -> int: a reduce's one C entry (reduce_now). At the root (the
 * round folds every rank's row in the Program's order): hot(x, out, s, seq), the
 * all-reduce's entry, but for its own contribution, which is folded from x and never
 * copied into the segment (root_body). At any other rank (the round folds nothing): x,
 * C-contiguous (it may be read-only) of the round's nbytes, written into this rank's
 * area (streamed from SHARE_NT bytes), published and waited for; out must be None (the
 * rank's buffers are not written). The header from set_head, recorded as collective
 * `seq` as hot() records. NOBUF when the arrays are not that (nothing was done: the
 * general path); otherwise run()'s codes (not -1: the entry stays started; the caller
 * completes the wait, the root writes its contribution into the segment and folds with
 * fold(), and completes the entry). */
static PyObject *Round_rhot(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (k->fold != NULL || k->alone >= 0)
        return hot_entry(k, args, nargs, 1);
    uint64_t s;
    long long seq;
    if (entry_words("rhot(x, out, s, seq)", args, nargs, &s, &seq) < 0)
        return NULL;
    Py_buffer xb;
    if (args[1] != Py_None || k->nrows != 0 ||
        take_buffer(args[0], &xb, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(NOBUF);
    }
    if (xb.len != k->nbytes) {
        PyBuffer_Release(&xb);
        return PyLong_FromLong(NOBUF);
    }
    int64_t *mark = fr_start(k, seq);
    const uint64_t h[3] = {k->head[0], k->head[1] | (s & 0xFFFFFFFFu), k->head[2]};
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = round_body(k, (int)(s & 1), s, h, xb.buf, xb.len, NULL, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&xb);
    if (r == -1)
        fr_done(k, mark, seq);
    return PyLong_FromLong(r);
}

/* ---- an all-reduce as a reduce-scatter and an all-gather through the segment ---------
 * Each rank stages (n-1)/n of its part (every block but its own), folds its own block of
 * every rank's part in the Program's order (its own from the input) into its cell of the
 * next parity a tile at a time, copying each tile from L1 into its output, then (share)
 * publishes that block and copies the peers' folded blocks out: per rank and part of S
 * bytes, (n-1)/n S staged, S read and 2S/n written by the fold, (n-1)/n S copied out
 * (4 S on 2 ranks against run()'s 5 S: copy all in, fold all of every row). */

/* d (in the segment) = the fold of the rows of parity p, the own row read from x's
 * skipped bytes, a tile at a time into L1, each tile then streamed to d (copy_out) and
 * copied to o (row_bytes) */
static void fold_tiles(Round *k, int p, const char *x, char *d, char *o) {
    char *rows[MAXR];
    char tile[TILE] __attribute__((aligned(64)));
    Py_ssize_t item = ITEMSIZE[k->dtype];
    for (Py_ssize_t t = 0; t < k->row_bytes; t += TILE) {
        Py_ssize_t m = k->row_bytes - t < TILE ? k->row_bytes - t : TILE;
        row_ptrs(k, p, t, rows);
        rows[k->srow - 1] = (char *)x + k->skip_lo + t;
        k->fold(tile, rows, k->nrows, m / item);
        copy_out(d + t, tile, m, m >= k->share_nt);
        cached_copy(o + t, tile, (size_t)m);
    }
}

/* ---- the split in one entry: the reduce-scatter call s, then the all-gather call s + 1
 * (share), with no return to Python between them (for every part, and on the hot path).
 * Non-temporal stores for out (copy_out) were 1.15-1.2x slower at 16 and 64 MiB. */
#define SECOND (1 << 25) /* added to the code of a call s + 1 that did not complete */

/* pair(share_round, dst0, dst1) -> None: this reduce-scatter round (skips set) and the
 * all-gather round `share_round` (places set, blocks of row_bytes) run as one split;
 * this rank's folded block goes to byte dst<p> of the segment for a call of parity
 * 1 - p (its cell of the next call) */
static PyObject *Round_pair(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pair(share_round, dst0, dst1)");
        return NULL;
    }
    Py_ssize_t d0 = PyLong_AsSsize_t(args[1]), d1 = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (Py_TYPE(args[0]) != Py_TYPE((PyObject *)k)) {
        PyErr_SetString(PyExc_TypeError, "pair: share_round must be a Round");
        return NULL;
    }
    Round *k2 = (Round *)args[0];
    if (k->srow == 0 || k2->place_off[0] == NULL || k2->base != k->base ||
        k2->nplace != k->nrows || k2->nbytes < k->row_bytes ||
        (Py_ssize_t)k2->nplace * k->row_bytes != k->nbytes || d0 < 0 || d1 < 0 ||
        d0 + k->row_bytes > k->seg.len || d1 + k->row_bytes > k->seg.len) {
        PyErr_SetString(PyExc_ValueError, "pair: no skips or places set, or blocks that "
                                          "do not match");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(k->pair, args[0]);
    k->pair_dst[0] = d0, k->pair_dst[1] = d1;
    Py_RETURN_NONE;
}

/* the split of a part of nbytes (GIL released): stage, publish s, wait, fold the own
 * block into the segment and out, publish s + 1 (the all-gather round's line), wait,
 * copy the peers' folded blocks into out. -1: done; a code of call s (as run()): nothing
 * folded; SECOND + a code of call s + 1: out's own block is written, the peers' are not */
static int split_body(Round *k, uint64_t s, const uint64_t h[3], const char *x, char *out) {
    Round *k2 = (Round *)k->pair;
    int p = (int)(s & 1);
    stage_others(k, p, x);
    int r = publish_wait(k, p, s, h);
    if (r != -1)
        return r;
    fold_tiles(k, p, x, k->base + k->pair_dst[1 - p], out + k->skip_lo);
    uint64_t s2 = s + 1;
    const uint64_t h2[3] = {h[0], (h[1] & ~(uint64_t)0xFFFFFFFFu) | (s2 & 0xFFFFFFFFu), h[2]};
    r = publish_wait(k2, 1 - p, s2, h2);
    if (r != -1)
        return SECOND + r;
    place_peers(k2, 1 - p, out, k->row_bytes, k->row_bytes);
    return -1;
}

/* split(x, out, s, h0, h1, h2) -> int: split_body for x and out of nbytes (out may be
 * x); the header words are call s's */
static PyObject *Round_split(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "split(x, out, s, h0, h1, h2)");
        return NULL;
    }
    uint64_t s, h[3];
    if (call_words(args + 2, &s, h) < 0)
        return NULL;
    if (k->pair == NULL) {
        PyErr_SetString(PyExc_ValueError, "split: no pair set");
        return NULL;
    }
    Py_buffer xb, ob;
    if (two_buffers(args[0], args[1], &xb, &ob) < 0)
        return NULL;
    const char *x = xb.buf, *o = ob.buf;
    if (xb.len != k->nbytes || ob.len != k->nbytes ||
        (x != o && x < o + ob.len && o < x + xb.len))
        return misfit(&xb, &ob, "split: the input or the output does not fit, or they overlap");
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = split_body(k, s, h, xb.buf, ob.buf);
    Py_END_ALLOW_THREADS
    release2(&xb, &ob);
    return PyLong_FromLong(r);
}

/* share(out, s, h0, h1, h2, off, block_bytes, m) -> int: gather() whose own part is
 * already in this rank's cell and in out: publish, wait, copy the peers' m bytes to
 * out + b * block_bytes + off (a split's second call after Python did its first). When
 * not -1, Python finishes the wait and copies. */
static PyObject *Round_share(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "share(out, s, h0, h1, h2, off, block_bytes, m)");
        return NULL;
    }
    uint64_t s, h[3];
    Py_ssize_t off = PyLong_AsSsize_t(args[5]), block = PyLong_AsSsize_t(args[6]);
    Py_ssize_t m = PyLong_AsSsize_t(args[7]);
    if (call_words(args + 1, &s, h) < 0)
        return NULL;
    if (k->place_off[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "share: no places set");
        return NULL;
    }
    Py_buffer ob;
    if (PyObject_GetBuffer(args[0], &ob, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (m < 0 || m > k->nbytes || off < 0 || block < 0 || off + m > block ||
        (Py_ssize_t)k->nplace * block > ob.len) {
        PyErr_SetString(PyExc_ValueError, "share: the part or the output does not fit");
        PyBuffer_Release(&ob);
        return NULL;
    }
    int p = (int)(s & 1), r;
    char *o = (char *)ob.buf + off;
    Py_BEGIN_ALLOW_THREADS
    r = publish_wait(k, p, s, h);
    if (r == -1)
        place_peers(k, p, o, block, m);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ob);
    return PyLong_FromLong(r);
}

/* ---- registered buffers in one entry (ringtree/runtime/protocols/ll_reg.py) ----------
 * After the agreement (Python: every rank's buffers lie in its arena; their addresses,
 * the peers' mapped once, come as integers), a registered call's data path and its LL
 * synchronisation in one entry with the GIL released: fold the rows (block `me` of
 * every rank's input where it lies, in rank order) into dst (block `me` of the own
 * output), copy every (dst, src, bytes) triple (an all-reduce's folded block pushed into
 * the peers' outputs, an all-gather's inputs, a broadcast's root), publish the call
 * and wait (no rank returns while a peer may still read or write
 * its buffers). The Round has no rows of its own: its lines, sleep words, budgets, dtype
 * and op. */
#define REG_PIECE (256 << 10) /* bytes per call of the fold loop: bfloat16's passes stay in L2 */

/* dst = the fold of rows (each `len` bytes); through an L1 tile copied out when dst
 * overlaps a row (in place: a row read after dst is written, or the fold loop's
 * `restrict`; a tile's rows are read before its bytes of dst are written), else
 * straight into dst a piece at a time */
static void reg_fold(fold_fn f, int item, char *const *rows, int nr, char *dst,
                     Py_ssize_t len) {
    int alias = 0;
    for (int i = 0; i < nr; i++)
        alias |= rows[i] < dst + len && dst < rows[i] + len;
    char *r[MAXR];
    char tile[TILE] __attribute__((aligned(64)));
    Py_ssize_t step = alias ? TILE : REG_PIECE;
    for (Py_ssize_t t = 0; t < len; t += step) {
        Py_ssize_t m = len - t < step ? len - t : step;
        for (int i = 0; i < nr; i++)
            r[i] = rows[i] + t;
        if (alias) {
            f(tile, r, nr, m / item);
            cached_copy(dst + t, tile, (size_t)m);
        } else {
            f(dst + t, r, nr, m / item);
        }
    }
}

/* ---- the single-copy all-reduce's block ---------------------------------------------- */

/* fold_push(pids, ins, outs, order, me, own, dst, at, dtype, op, piece, scratch) -> status
 * One rank's block of the single-copy all-reduce on plain buffers
 * (ringtree/runtime/protocols/ll_direct_fold.py) in one call with the GIL released: for
 * each piece of `piece` bytes, every peer's row read from its input with
 * process_vm_readv into the peer's slot of `scratch`, the rows folded in `order` into
 * dst (reg_fold: through an L1 tile where dst is the own row, in place), then the folded
 * piece written from L2 into every peer's output with process_vm_writev (outs None:
 * not pushed, the reduce-scatter's block).
 * pids, ins, outs: by rank (the own entries unused), ins/outs the addresses of this
 * block's first byte in every rank's input and output; order: the fold's ranks; own:
 * this rank's row (its input's block), dst: its output's block, as long; scratch: at
 * least (ranks - 1) * (piece + 4096) bytes. 0, or q << 32 | errno of the first failed move, with
 * 1 << 16 set when it was a write into q's output. */
#define PUSH_WROTE (1 << 16)
/* PUSH_SLOT: each peer's slot of the scratch is a piece and a page: where the kernel copies a
 * peer's row to differed by 16 bytes in its page from where it copies from (a NumPy
 * array's data lies 16 bytes into its pages), the 4-rank all-reduce at 1 MiB took
 * 1,518 µs against 615-695 at every other offset (AMD EPYC Zen 3, whose `rep movsb`,
 * the kernel's copy, slows when its two sides differ within a cache line). */
static long long push_body(fold_fn f, int item, int n, int me, const Py_ssize_t *pids,
                           const Py_ssize_t *ins, const Py_ssize_t *outs,
                           const Py_ssize_t *order, char *own, char *dst, Py_ssize_t len,
                           Py_ssize_t piece, char *scratch) {
    char *rows[MAXR];
    for (Py_ssize_t off = 0; off < len; off += piece) {
        Py_ssize_t m = len - off < piece ? len - off : piece;
        int slot = 0;
        for (int k = 0; k < n; k++) {
            int q = (int)order[k];
            if (q == me) {
                rows[k] = own + off;
                continue;
            }
            /* the slot's copy starts at the source's offset within its page: the
             * kernel's copy runs at the same alignment on both sides, and the reads
             * after it do not alias its stores (PUSH_SLOT) */
            char *slot_at = scratch + (Py_ssize_t)slot++ * (piece + 4096);
            uintptr_t src = (uintptr_t)(ins[q] + off);
            rows[k] = slot_at + ((src - (uintptr_t)slot_at) & 4095);
            struct iovec lv = {rows[k], (size_t)m};
            struct iovec rv = {(void *)src, (size_t)m};
            int err = move_spans((pid_t)pids[q], &lv, &rv, 1, 0);
            if (err)
                return (long long)q << 32 | err;
        }
        reg_fold(f, item, rows, n, dst + off, m);
        for (int q = 0; outs != NULL && q < n; q++) {
            if (q == me)
                continue;
            struct iovec lv = {dst + off, (size_t)m};
            struct iovec rv = {(void *)(uintptr_t)(outs[q] + off), (size_t)m};
            int err = move_spans((pid_t)pids[q], &lv, &rv, 1, 1);
            if (err)
                return (long long)q << 32 | PUSH_WROTE | err;
        }
    }
    return 0;
}

static PyObject *fold_push(PyObject *self, PyObject *args) {
    PyObject *pids_o, *ins_o, *outs_o, *order_o, *own_o, *dst_o, *scr_o;
    int me, dtype, op;
    Py_ssize_t piece;
    unsigned long long at;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOiOOKiinO", &pids_o, &ins_o, &outs_o, &order_o, &me,
                          &own_o, &dst_o, &at, &dtype, &op, &piece, &scr_o))
        return NULL;
    Py_ssize_t n = PySequence_Size(order_o);
    fold_fn f = pick(dtype, op);
    if (n < 2 || n > MAXR || me < 0 || me >= n || f == NULL || piece <= 0 ||
        piece % ITEMSIZE[dtype]) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "fold_push: 2 to 256 ranks, me one of them, a "
                                              "dtype and op the kernel folds, whole items a piece");
        return NULL;
    }
    Py_ssize_t pids[MAXR], ins[MAXR], outs[MAXR], order[MAXR];
    if (read_index_list(pids_o, n, pids, "fold_push: pids") < 0 ||
        read_index_list(ins_o, n, ins, "fold_push: ins") < 0 ||
        (outs_o != Py_None && read_index_list(outs_o, n, outs, "fold_push: outs") < 0) ||
        read_index_list(order_o, n, order, "fold_push: order") < 0)
        return NULL;
    for (int i = 0; i < n; i++) {
        ins[i] += (Py_ssize_t)at;
        outs[i] = outs_o == Py_None ? 0 : outs[i] + (Py_ssize_t)at;
        if (order[i] < 0 || order[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "fold_push: order holds a rank out of range");
            return NULL;
        }
    }
    Py_buffer own, dst, scr;
    if (two_buffers(own_o, dst_o, &own, &dst) < 0)
        return NULL;
    if (PyObject_GetBuffer(scr_o, &scr, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&own);
        PyBuffer_Release(&dst);
        return NULL;
    }
    long long status = -1;
    if (own.len != dst.len || own.len % ITEMSIZE[dtype] || scr.len < (n - 1) * (piece + 4096))
        PyErr_SetString(PyExc_ValueError, "fold_push: own and dst of one length in whole "
                                          "items, scratch of (ranks - 1) pieces and pages");
    else {
        Py_BEGIN_ALLOW_THREADS
        status = push_body(f, ITEMSIZE[dtype], (int)n, me, pids, ins,
                           outs_o == Py_None ? NULL : outs, order, own.buf, dst.buf, own.len,
                           piece, scr.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&own);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&scr);
    return status < 0 ? NULL : PyLong_FromLongLong(status);
}

/* the registered call, GIL released: -1 done, else a code of call s (as run()): all but
 * that wait is done. `stream`: the copies with non-temporal stores (no read for
 * ownership; a line written into another core's cache costs more here than one
 * streamed to memory) */
static int reg_body(Round *k, uint64_t s, const uint64_t h[3], fold_fn f, char *const *rows,
                    int nr, char *dst, Py_ssize_t len, char *const *cp, int ncp, int stream) {
    if (nr > 0 && len > 0)
        reg_fold(f, ITEMSIZE[k->dtype], rows, nr, dst, len);
    for (int i = 0; i < ncp; i++)
        copy_out(cp[3 * i], cp[3 * i + 1], (Py_ssize_t)cp[3 * i + 2], stream);
    return publish_wait(k, (int)(s & 1), s, h);
}

/* integers (addresses, or byte counts) of a tuple into dst (at most `max`): their
 * number, or -1 with an exception */
static int read_words(PyObject *t, char **dst, int max, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > max) {
        PyErr_Format(PyExc_ValueError, "reg: %s must be a tuple of at most %d integers",
                     what, max);
        return -1;
    }
    int n = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < n; i++) {
        dst[i] = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, i));
        if (dst[i] == NULL && PyErr_Occurred())
            return -1;
    }
    return n;
}

/* ---- the agreement in the same entry --------------------------------------------------
 * A call on the same buffers as the last one (the usual loop) also leaves the agreement
 * to the entry: mark the call in the state line (its number last, after the locations
 * and the header), then wait for each peer's mark within the budgets and compare its
 * header and locations with the last call's. Anything else (a peer asleep, late, not
 * registered, another header or other locations) is REG_LEARN: nothing done after the
 * mark, and Python's agreement (ll_reg) goes on from there with the LL waits. */
#define REG_LEARN (-RING - 2)
enum { RW_SEQ, RW_IN, RW_OUT, RW_HEAD, RW_ANN };

/* reg_words(state, peer_states, (seq, in, out, head, ann)) -> None: where reg's
 * agreement writes and reads (word indices of the segment; offsets in a state line) */
static PyObject *Round_reg_words(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reg_words(state, peer_states, offsets)");
        return NULL;
    }
    Py_ssize_t st = PyLong_AsSsize_t(args[0]), w[5];
    if (PyErr_Occurred() || read_index_list(args[2], 5, w, "offsets") < 0)
        return NULL;
    Py_ssize_t *peer = PyMem_Calloc(k->npeers + 1, sizeof(Py_ssize_t));
    if (peer == NULL)
        return PyErr_NoMemory();
    if (read_index_list(args[1], k->npeers, peer, "peer_states") < 0) {
        PyMem_Free(peer);
        return NULL;
    }
    Py_ssize_t top = (k->seg.len >> 3) - 8, hi = st;
    for (int i = 0; i < k->npeers; i++)
        hi = peer[i] > hi ? peer[i] : hi;
    int bad = st < 0 || hi > top;
    for (int i = 0; i < 5; i++)
        bad |= w[i] < 0 || w[i] + (i == RW_HEAD ? 3 : 1) > 16;
    if (bad) {
        PyMem_Free(peer);
        PyErr_SetString(PyExc_ValueError, "reg_words: words past the segment or the line");
        return NULL;
    }
    PyMem_Free(k->reg_peer);
    k->reg_peer = peer, k->reg_state = st;
    memcpy(k->reg_w, w, sizeof w);
    Py_RETURN_NONE;
}

/* does peer i show call s: marked, posted on its line, or announced (for Simple)? */
static inline int reg_seen(Round *k, int i, int p, uint64_t s) {
    Py_ssize_t st = k->reg_peer[i];
    return __atomic_load_n(word(k, st + k->reg_w[RW_SEQ]), __ATOMIC_ACQUIRE) == s ||
           __atomic_load_n(word(k, k->peer_word[p][i]), __ATOMIC_ACQUIRE) >= s ||
           __atomic_load_n(word(k, st + k->reg_w[RW_ANN]), __ATOMIC_ACQUIRE) >= s;
}

/* mark call s (locations wi, wo, header h), wait for every peer's within the budgets:
 * -1 when each marked it with our header and the locations in `locs` (2 a peer),
 * else REG_LEARN. GIL released. */
static int reg_agree(Round *k, uint64_t s, const uint64_t h[3], uint64_t wi, uint64_t wo,
                     const uint64_t *locs) {
    Py_ssize_t me = k->reg_state, *w = k->reg_w;
    *word(k, me + w[RW_IN]) = wi;
    *word(k, me + w[RW_OUT]) = wo;
    for (int j = 0; j < 3; j++)
        *word(k, me + w[RW_HEAD] + j) = h[j];
    __atomic_store_n(word(k, me + w[RW_SEQ]), s, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* our mark before their sleep flags */
    for (int i = 0; i < k->npeers; i++)
        if (*word(k, k->peer_sleep[i]))
            return REG_LEARN; /* Python rings its bell */
    int p = (int)(s & 1), yielding = 0;
    int64_t start = 0, spin_end = 0, end = 0;
    for (int i = 0; i < k->npeers; i++) {
        unsigned n = 0;
        while (!reg_seen(k, i, p, s)) { /* as wait_peers: spin, then yield, then Python */
            if (start == 0) {
                start = now_ns();
                spin_end = start + k->spin_ns, end = start + k->yield_ns;
                end = end < spin_end ? spin_end : end;
                yielding = k->spin_ns <= 0; /* ranks outnumber cores: no spin */
            }
            if (yielding) {
                sched_yield();
                if (now_ns() >= end)
                    return REG_LEARN;
                continue;
            }
            CPU_RELAX();
            if ((++n & 63) == 0) {
                int64_t t = now_ns();
                if (t >= end)
                    return REG_LEARN;
                yielding = t >= spin_end;
            }
        }
        Py_ssize_t st = k->reg_peer[i]; /* (acquire: its words before its number) */
        if (__atomic_load_n(word(k, st + w[RW_SEQ]), __ATOMIC_ACQUIRE) != s ||
            *word(k, st + w[RW_IN]) != locs[2 * i] ||
            *word(k, st + w[RW_OUT]) != locs[2 * i + 1])
            return REG_LEARN;
        for (int j = 0; j < 3; j++)
            if (*word(k, st + w[RW_HEAD] + j) != h[j])
                return REG_LEARN;
    }
    return -1;
}

/* reg(s, h0, h1, h2, rows, dst, nbytes, copies, stream[, agree]) -> int: reg_body.
 * rows: the addresses of the rows to fold, in order (empty: no fold); dst, nbytes: where
 * the fold goes and its bytes; copies: (dst, src, bytes) flattened; stream: with
 * non-temporal stores. agree: (in, out, peers' locations) when the entry also makes the
 * agreement (reg_agree: REG_LEARN, or reg_body's codes). The caller keeps every address
 * valid and C-contiguous (its arrays and the peers' mappings) and runs LL.parity first. */
static PyObject *Round_reg(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "reg(s, h0, h1, h2, rows, dst, nbytes, copies, stream[, agree])");
        return NULL;
    }
    uint64_t s, h[3], wio[2] = {0, 0}, locs[2 * MAXR];
    if (call_words(args, &s, h) < 0)
        return NULL;
    char *rows[MAXR], *cp[3 * MAXR], *a[2 + 2 * MAXR];
    int nr = read_words(args[4], rows, MAXR, "rows");
    int ncp = nr < 0 ? -1 : read_words(args[7], cp, 3 * MAXR, "copies");
    int na = nargs == 10 && ncp >= 0 ? read_words(args[9], a, 2 + 2 * MAXR, "agree") : 0;
    char *dst = nr < 0 || ncp < 0 || na < 0 ? NULL : (char *)PyLong_AsVoidPtr(args[5]);
    Py_ssize_t len = PyLong_AsSsize_t(args[6]);
    int stream = PyObject_IsTrue(args[8]);
    if (nr < 0 || ncp < 0 || na < 0 || PyErr_Occurred() || stream < 0)
        return NULL;
    fold_fn f = pick(k->dtype, k->op);
    if (ncp % 3 || len < 0 || (nr > 0 && (nr < 2 || f == NULL || len % ITEMSIZE[k->dtype])) ||
        (nargs == 10 && (k->reg_peer == NULL || na != 2 + 2 * k->npeers))) {
        PyErr_SetString(PyExc_ValueError, "reg: bad rows, copies, bytes or agreement, or "
                                          "no fold");
        return NULL;
    }
    for (int i = 0; i < na; i++) {
        if (i < 2)
            wio[i] = (uint64_t)(uintptr_t)a[i];
        else
            locs[i - 2] = (uint64_t)(uintptr_t)a[i];
    }
    int r = -1;
    Py_BEGIN_ALLOW_THREADS
    if (na)
        r = reg_agree(k, s, h, wio[0], wio[1], locs);
    if (r == -1)
        r = reg_body(k, s, h, f, rows, nr, dst, len, cp, ncp / 3, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

/* stores([share_nt]) -> int: copies into the segment of at least share_nt bytes stream
 * (copy_out); smaller ones, and all of them for a share_nt past any copy, go through the
 * caches. Returns the value in force (before the change, if one is given). */
static PyObject *Round_stores(Round *k, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t was = k->share_nt;
    if (nargs == 0)
        return PyLong_FromSsize_t(was);
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "stores([share_nt])");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "stores: share_nt must be >= 0");
        return NULL;
    }
    k->share_nt = n;
    return PyLong_FromSsize_t(was);
}

#include "_direct.h"

static PyMethodDef Round_methods[] = {
    {"direct", (PyCFunction)(void (*)(void))Round_direct, METH_FASTCALL,
     "direct(mode, me, pids, pay0, pay1, order, block, lo, hi, piece, own_copy, scratch)"
     ": the single copy's calls (dcall)"},
    {"dcall", (PyCFunction)(void (*)(void))Round_dcall, METH_FASTCALL,
     "dcall(x, out, s, seq[, ident]): a single-copy call in one entry (NOBUF: not for it)"},
    {"stores", (PyCFunction)(void (*)(void))Round_stores, METH_FASTCALL,
     "stores([share_nt]) -> int: copies into the segment from share_nt bytes stream"},
    {"run", (PyCFunction)(void (*)(void))Round_run, METH_FASTCALL,
     "run(x, out, s, h0, h1, h2): contribute, publish, wait, fold"},
    {"wait", (PyCFunction)(void (*)(void))Round_wait, METH_FASTCALL,
     "wait(s, first): wait for the peers from index first on"},
    {"fold", (PyCFunction)(void (*)(void))Round_fold, METH_FASTCALL,
     "fold(out, parity[, skip_bytes]): fold the rows into out"},
    {"places", (PyCFunction)(void (*)(void))Round_places, METH_FASTCALL,
     "places(rows0, rows1, own): where a gather's output blocks come from"},
    {"gather", (PyCFunction)(void (*)(void))Round_gather, METH_FASTCALL,
     "gather(x, out, s, h0, h1, h2, off, block_bytes): contribute, publish, place"},
    {"ghot", (PyCFunction)(void (*)(void))Round_ghot, METH_FASTCALL,
     "ghot(x, out, s, seq): an all-gather in one entry, recorded (NOBUF: not for it)"},
    {"skips", (PyCFunction)(void (*)(void))Round_skips, METH_FASTCALL,
     "skips(row, lo, hi): a scatter's own fold row, bytes of the input no peer reads"},
    {"share", (PyCFunction)(void (*)(void))Round_share, METH_FASTCALL,
     "share(out, s, h0, h1, h2, off, block_bytes, m): publish, copy the peers' parts"},
    {"pair", (PyCFunction)(void (*)(void))Round_pair, METH_FASTCALL,
     "pair(share_round, dst0, dst1): run with share_round as one split"},
    {"split", (PyCFunction)(void (*)(void))Round_split, METH_FASTCALL,
     "split(x, out, s, h0, h1, h2): reduce-scatter call s, then share call s + 1"},
    {"scatter", (PyCFunction)(void (*)(void))Round_scatter, METH_FASTCALL,
     "scatter(x, out, s, h0, h1, h2): run() reading the own block from x"},
    {"bshot", (PyCFunction)(void (*)(void))Round_bshot, METH_FASTCALL,
     "bshot(x, out, s, seq): an in-place broadcast in one entry (NOBUF: not for it)"},
    {"shot", (PyCFunction)(void (*)(void))Round_shot, METH_FASTCALL,
     "shot(x, out, s, seq): a reduce-scatter in one entry, recorded (NOBUF: not for it)"},
    {"reg", (PyCFunction)(void (*)(void))Round_reg, METH_FASTCALL,
     "reg(s, h0, h1, h2, rows, dst, nbytes, copies, stream[, agree]): a registered call"},
    {"reg_words", (PyCFunction)(void (*)(void))Round_reg_words, METH_FASTCALL,
     "reg_words(state, peer_states, offsets): where reg's agreement writes and reads"},
    {"rhot", (PyCFunction)(void (*)(void))Round_rhot, METH_FASTCALL,
     "rhot(x, out, s, seq) -> int: a reduce's one entry (the root: hot; others write)"},
    {"hot", (PyCFunction)(void (*)(void))Round_hot, METH_FASTCALL,
     "hot(x, out, s, seq[, ident]): the round from x into out, recorded (NOBUF: not for it)"},
    {"alone", (PyCFunction)(void (*)(void))Round_alone, METH_FASTCALL,
     "alone(nbytes, scale): one rank's round: every entry copies or scales x into out"},
    {"expect", (PyCFunction)(void (*)(void))Round_expect, METH_FASTCALL,
     "expect(dtype): the dtype object hot's x must have (None: any)"},
    {"record", (PyCFunction)(void (*)(void))Round_record, METH_FASTCALL,
     "record(ring, marks, ctr, desc, recorder): the flight recorder hot writes"},
    {"set_head", (PyCFunction)(void (*)(void))Round_set_head, METH_FASTCALL,
     "set_head(h0, h1, h2): the call words hot publishes"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RoundType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringtree.transports._llc.Round",
    .tp_basicsize = sizeof(Round),
    .tp_dealloc = (destructor)Round_dealloc,
    .tp_weaklistoffset = offsetof(Round, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One prepared LL round on a segment (see the module's source).",
    .tp_methods = Round_methods,
    .tp_new = Round_new,
};

/* folds(dtype, op) -> bool: does the kernel fold this pair? */
static PyObject *folds(PyObject *self, PyObject *args) {
    int dtype, op;
    (void)self;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op))
        return NULL;
    return PyBool_FromLong(pick(dtype, op) != NULL);
}

static PyMethodDef module_methods[] = {
    {"folds", folds, METH_VARARGS, "folds(dtype, op): whether the kernel folds the pair"},
    {"fold_push", fold_push, METH_VARARGS,
     "fold_push(pids, ins, outs, order, me, own, dst, at, dtype, op, piece, scratch): the "
     "single-copy all-reduce's block, GIL released (0 or q << 32 | errno)"},
    {"ndlayout", nd_layout, METH_VARARGS,
     "ndlayout(ndarray, probes): read NumPy arrays' fields if the probes agree (_ndview.h)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_llc",
                                    "LL's data path compiled (see ringtree.transports.shm_native).",
                                    -1, module_methods};

PyMODINIT_FUNC PyInit__llc(void) {
    if (PyType_Ready(&RoundType) < 0)
        return NULL;
    PyObject *m = rt_module_create(&module);
    if (m == NULL)
        return NULL;
    static const struct { const char *name; long value; } consts[] = {
        {"RING", RING}, {"NOBUF", NOBUF}, {"NOTMINE", NOTMINE}, {"SECOND", SECOND},
        {"REG_LEARN", REG_LEARN}, {"D_GONE", D_GONE}, {"D_FAILED", D_FAILED},
        {"DM_PUSH", DM_PUSH}, {"DM_READ", DM_READ}, {"DM_FOLD", DM_FOLD},
        {"DM_FOLD_PUSH", DM_FOLD_PUSH}, {"DM_BCAST", DM_BCAST}, {"OWN_MEMCPY", OWN_MEMCPY},
        {"OWN_STREAM", OWN_STREAM}};
    Py_INCREF(&RoundType);
    int bad = PyModule_AddObject(m, "Round", (PyObject *)&RoundType) < 0;
    for (size_t i = 0; i < sizeof consts / sizeof consts[0] && !bad; i++)
        bad = PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0;
    if (bad) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
