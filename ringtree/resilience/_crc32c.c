/* CRC-32C (Castagnoli; RFC 3720 appendix B.4) of a buffer, for the state transfer's
 * per-chunk checksums (ringtree/resilience/checksum.py).
 *
 * x86-64 with SSE4.2: the CRC32 instruction, 8 bytes at a time, chosen at run time
 * (__builtin_cpu_supports); elsewhere, a table-driven loop (Sarwate's byte-at-a-time
 * algorithm, reflected polynomial 0x82F63B78). Both give the same value. The GIL is
 * released while the buffer is read. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_kernel.h"
#include <stdint.h>
#include <string.h>

static uint32_t table[256];

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
    while (n--)
        crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW 1
__attribute__((target("sse4.2")))
static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#else
#define HAVE_HW 0
#endif

static int use_hw = 0;

static PyObject *crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &buf, &value))
        return NULL;
    uint32_t crc = ~(uint32_t)value;
    const unsigned char *p = (const unsigned char *)buf.buf;
    size_t n = (size_t)buf.len;
    Py_BEGIN_ALLOW_THREADS
#if HAVE_HW
    crc = use_hw ? crc_hw(crc, p, n) : crc_soft(crc, p, n);
#else
    crc = crc_soft(crc, p, n);
#endif
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong((unsigned long)~crc);
}

static PyObject *hardware(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(use_hw);
}

static PyMethodDef methods[] = {
    {"crc32c", crc32c, METH_VARARGS,
     "crc32c(buffer, value=0) -> int: CRC-32C of a contiguous buffer, continuing value."},
    {"hardware", hardware, METH_NOARGS, "hardware() -> bool: the SSE4.2 instruction is used."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crc32c", NULL, -1, methods};

PyMODINIT_FUNC PyInit__crc32c(void) {
    make_table();
#if HAVE_HW
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2");
#endif
    return rt_module_create(&module);
}
