/* Every compiled kernel's module carries the digest of the sources it was built from
 * (SOURCE_DIGEST, defined by setup.py), so that ringtree/kernels.py loads it only when it
 * matches the sources beside it. */
#ifndef RINGTREE_KERNEL_H
#define RINGTREE_KERNEL_H

#ifndef RT_SOURCE_DIGEST
#define RT_SOURCE_DIGEST ""
#endif

static PyObject *rt_module_create(PyModuleDef *def)
{
    PyObject *m = PyModule_Create(def);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", RT_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#endif
