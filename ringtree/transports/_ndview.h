/* take_buffer: a NumPy array's memory without the buffer protocol's export, for the
 * one-entry calls of _llc.c (docs/design-notes.md, "The per-call cost: one frame, the
 * array's fields").
 *
 * PyObject_GetBuffer on an ndarray (NumPy builds the format string, shape and strides of
 * every export) was about a third of Round.hot's C time, 45 of ~175 ns. An exact ndarray's data pointer, dimensions, dtype object and flags are the
 * first fields of its object (PyArrayObject_fields in numpy/ndarraytypes.h, the same
 * from NumPy 1.7 to 2.x); the package builds without NumPy's headers, so the fields are
 * declared here and read only after nd_layout() compared them with NumPy's own answers
 * for a few probe arrays (shm_native.py): any disagreement leaves nd_type NULL and every
 * call takes the buffer protocol, as before. The itemsize and format of a dtype object
 * come from its first buffer export (the object is then kept alive, so its address is
 * never another dtype's). take_buffer answers as PyObject_GetBuffer would for
 * PyBUF_C_CONTIGUOUS requests (writability when asked); an array it cannot answer for
 * (not contiguous or not writable where asked, a subclass, a dtype not seen yet, a flag
 * that is not one of NumPy's public ones) takes
 * the buffer protocol, whose refusal the entries turn into NOBUF as before. The buffer
 * it fills holds no export (obj NULL: PyBuffer_Release does nothing). */
#ifndef RINGTREE_NDVIEW_H
#define RINGTREE_NDVIEW_H

#include <Python.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
    PyObject *base, *descr;
    int flags;
} NDFields;

#define ND_C_CONTIGUOUS 0x0001 /* NPY_ARRAY_C_CONTIGUOUS */
#define ND_WRITEABLE 0x0400    /* NPY_ARRAY_WRITEABLE */
/* every public NPY_ARRAY_* flag; an array with another (NumPy's private ones, such as the
 * warn-on-write of np.broadcast_arrays' views) takes the buffer protocol, which heeds it */
#define ND_PUBLIC 0x67F7
#define ND_KINDS 16

static PyTypeObject *nd_type = NULL; /* numpy.ndarray once the layout was checked */
static struct {
    PyObject *descr; /* a strong reference */
    Py_ssize_t itemsize;
    char format[8];
} nd_kinds[ND_KINDS];
static int nd_nkinds = 0;

/* remember the itemsize and format of a's dtype from its export b */
static void nd_learn(NDFields *a, const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (nd_nkinds == ND_KINDS || strlen(f) >= sizeof nd_kinds[0].format)
        return;
    for (int i = 0; i < nd_nkinds; i++)
        if (nd_kinds[i].descr == a->descr)
            return;
    Py_INCREF(a->descr);
    nd_kinds[nd_nkinds].descr = a->descr;
    nd_kinds[nd_nkinds].itemsize = b->itemsize;
    strcpy(nd_kinds[nd_nkinds].format, f);
    nd_nkinds++;
}

/* o's memory as PyObject_GetBuffer(o, b, flags) gives it (an ndarray's with its format,
 * asked or not), flags being PyBUF_C_CONTIGUOUS with PyBUF_WRITABLE, PyBUF_FORMAT or
 * neither: 0, or -1 with an exception set */
static int take_buffer(PyObject *o, Py_buffer *b, int flags) {
    if (Py_TYPE(o) != nd_type)
        return PyObject_GetBuffer(o, b, flags);
    NDFields *a = (NDFields *)o;
    int need = ND_C_CONTIGUOUS | ((flags & PyBUF_WRITABLE) ? ND_WRITEABLE : 0);
    int ok = (a->flags & need) == need && (a->flags & ~ND_PUBLIC) == 0;
    for (int i = 0; i < nd_nkinds && ok; i++) {
        if (nd_kinds[i].descr != a->descr)
            continue;
        Py_ssize_t n = 1;
        for (int d = 0; d < a->nd; d++)
            n *= a->dimensions[d];
        b->buf = a->data, b->obj = NULL, b->len = n * nd_kinds[i].itemsize;
        b->itemsize = nd_kinds[i].itemsize, b->readonly = !(a->flags & ND_WRITEABLE);
        b->ndim = a->nd, b->format = nd_kinds[i].format, b->shape = a->dimensions;
        b->strides = NULL, b->suboffsets = NULL, b->internal = NULL;
        return 0;
    }
    if (PyObject_GetBuffer(o, b, flags | PyBUF_FORMAT) < 0)
        return -1;
    nd_learn(a, b);
    return 0;
}

/* is o's dtype object d? (an ndarray's field once checked, else its `dtype` attribute);
 * 0 when o has none */
static int has_descr(PyObject *o, PyObject *d) {
    if (Py_TYPE(o) == nd_type)
        return ((NDFields *)o)->descr == d;
    PyObject *t = PyObject_GetAttrString(o, "dtype");
    if (t == NULL)
        PyErr_Clear();
    Py_XDECREF(t);
    return t != NULL && t == d;
}

/* ndlayout(ndarray, probes) -> bool: probes a sequence of (array, data address, shape,
 * dtype, C-contiguous, writeable) as NumPy reports them; take_buffer reads the fields
 * from now on if every probe's fields agree (ndarray None: never) */
static PyObject *nd_layout(PyObject *mod, PyObject *args) {
    PyObject *type, *probes;
    if (!PyArg_ParseTuple(args, "OO", &type, &probes))
        return NULL;
    nd_type = NULL;
    if (type == Py_None)
        Py_RETURN_FALSE;
    if (!PyType_Check(type) || !PyTuple_Check(probes)) {
        PyErr_SetString(PyExc_TypeError, "ndlayout(ndarray, probes: tuple)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(probes); i++) {
        PyObject *arr, *shape, *descr;
        unsigned long long data;
        int contig, writeable;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(probes, i), "OKO!Opp", &arr, &data,
                              &PyTuple_Type, &shape, &descr, &contig, &writeable))
            return NULL;
        NDFields *a = (NDFields *)arr;
        int ok = Py_TYPE(arr) == (PyTypeObject *)type && (unsigned long long)(uintptr_t)a->data == data &&
                 a->nd == PyTuple_GET_SIZE(shape) && a->descr == descr &&
                 !!(a->flags & ND_C_CONTIGUOUS) == contig && !!(a->flags & ND_WRITEABLE) == writeable;
        for (int d = 0; ok && d < a->nd; d++)
            ok = a->dimensions[d] == PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (PyErr_Occurred())
            return NULL;
        if (!ok)
            Py_RETURN_FALSE;
    }
    Py_INCREF(type); /* kept for good: the type is NumPy's static one */
    nd_type = (PyTypeObject *)type;
    Py_RETURN_TRUE;
}

#endif
