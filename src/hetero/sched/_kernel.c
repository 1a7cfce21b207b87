/* The placement hot path in C: the expected-delay score of every device and the size-class
 * sums it reads (hetero/sched/view.py).
 *
 * Every placement ranks every device, and every item that waits in a device queue updates that
 * device's sums by size class twice. In numpy each is a handful of vector operations, and at
 * tens of devices each operation costs its call overhead (about a microsecond) rather than its
 * arithmetic. Here each is one call and one pass.
 *
 * The arithmetic is numpy's, operation for operation and in the same order, so a score is
 * bit-identical to FleetView's numpy expression (the fallback where this module is not built;
 * tests/sched/test_kernel.py holds the two to that). Built with -ffp-contract=off: a fused
 * multiply-add would round differently.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <math.h>
#include <string.h>

/* Same spacing as view.py's _TIE: work units per item in flight that break free items' ties. */
#define TIE 1e-9

/* The passes over the devices are compiled twice on x86-64, for AVX2 and for the baseline, and
 * the loader picks one for the machine (numpy dispatches its loops the same way). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DISPATCHED __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef DISPATCHED
#define DISPATCHED
#endif

/* The data of obj, a C-contiguous numpy array of at least `count` values of `type`
 * (NPY_FLOAT64 or NPY_INT64); NULL with ValueError naming the argument otherwise. */
static void *
data_of(PyObject *obj, npy_intp count, int type, int writable, const char *name)
{
    const char *what = type == NPY_FLOAT64 ? "float64" : "int64";
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a numpy %s array, got %.100s", name, what,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)obj;
    if (!PyArray_EquivTypenums(PyArray_TYPE(array), type) || !PyArray_IS_C_CONTIGUOUS(array)
        || PyArray_SIZE(array) < count || (writable && !PyArray_ISWRITEABLE(array))) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a C-contiguous%s %s array of at least %zd values, got %zd "
                     "values of %s",
                     name, writable ? " writable" : "", what, (Py_ssize_t)count,
                     (Py_ssize_t)PyArray_SIZE(array), PyArray_DESCR(array)->typeobj->tp_name);
        return NULL;
    }
    return PyArray_DATA(array);
}

PyDoc_STRVAR(note_queued_doc,
"note_queued(sums, rows, index, size_class, cost, sign)\n--\n\n"
"An item of cost in size_class joined (sign 1) or left (-1) device index's queue. sums:\n"
"float64, shape (classes + 1, n, 2), per row and device the work below the row's class and\n"
"the items from it up; rows = [lo, hi], the rows kept (lo <= k <= hi, k = size_class + 1).\n"
"Adds sign * cost to the work of rows k to hi, and sign to the items of rows lo - 1 to k - 1.");

static PyObject *
note_queued(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "note_queued() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t index = PyLong_AsSsize_t(args[2]);
    Py_ssize_t k = PyLong_AsSsize_t(args[3]) + 1;
    double cost = PyFloat_AsDouble(args[4]);
    long sign = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    double *sums = data_of(args[0], 0, NPY_FLOAT64, 1, "sums");
    const npy_int64 *rows = sums ? data_of(args[1], 2, NPY_INT64, 0, "rows") : NULL;
    if (rows == NULL)
        return NULL;
    PyArrayObject *array = (PyArrayObject *)args[0];
    if (PyArray_NDIM(array) != 3 || PyArray_DIM(array, 2) != 2) {
        PyErr_SetString(PyExc_ValueError, "sums: expected an array of shape (rows, devices, 2)");
        return NULL;
    }
    Py_ssize_t height = PyArray_DIM(array, 0), n = PyArray_DIM(array, 1);
    Py_ssize_t lo = (Py_ssize_t)rows[0], hi = (Py_ssize_t)rows[1];
    if (index < 0 || index >= n || lo < 1 || hi >= height || k < lo || k > hi) {
        PyErr_Format(PyExc_ValueError,
                     "index %zd or size_class %zd out of range: %zd devices, rows %zd to %zd kept "
                     "of %zd",
                     index, k - 1, n, lo, hi, height);
        return NULL;
    }
    double step = (double)sign, work = step * cost;
    for (Py_ssize_t r = k; r <= hi; r++)
        sums[(r * n + index) * 2] += work;
    for (Py_ssize_t r = lo - 1; r < k; r++)
        sums[(r * n + index) * 2 + 1] += step;
    Py_RETURN_NONE;
}

/* What the scores are made of; a NULL array is a term left out. */
struct terms {
    const double *base, *inv, *minus;
    const double *pairs; /* row k of the sums: device j's work below at 2j, items from at 2j + 1 */
    const npy_int64 *parallel, *in_flight;
    double cost, a; /* a: cost * weight */
};

/* numpy's operations in numpy's order (view.py, FleetView._delay_numpy), in passes with no
 * branch inside, so that the compiler vectorises each. The usual cases take scores_lowest's
 * one pass instead; this makes the rest, and the last few devices of those. */
DISPATCHED static void
scores(double *restrict s, const struct terms *t, Py_ssize_t n)
{
    const double *restrict base = t->base, *restrict inv = t->inv;
    const double cost = t->cost, a = t->a;
    if (t->pairs) {
        const double *restrict pairs = t->pairs;
        for (Py_ssize_t j = 0; j < n; j++) {
            double x = pairs[2 * j + 1] * a;
            x += base[j];
            x += pairs[2 * j];
            s[j] = x + cost;
        }
    }
    else
        for (Py_ssize_t j = 0; j < n; j++)
            s[j] = base[j] + cost;
    if (t->minus) {
        const double *restrict minus = t->minus;
        for (Py_ssize_t j = 0; j < n; j++)
            s[j] -= minus[j];
    }
    if (cost == 0) {
        const npy_int64 *restrict in_flight = t->in_flight;
        for (Py_ssize_t j = 0; j < n; j++)
            s[j] = isinf(inv[j]) ? INFINITY : s[j] * inv[j] + (double)in_flight[j] * TIE;
        return;
    }
    for (Py_ssize_t j = 0; j < n; j++)
        s[j] *= inv[j];
    if (t->parallel) {
        const npy_int64 *restrict parallel = t->parallel;
        for (Py_ssize_t j = 0; j < n; j++) {
            /* np.maximum: a NaN on either side wins */
            double floor = (double)parallel[j] * (cost * inv[j]), x = s[j];
            s[j] = (isnan(floor) || (!isnan(x) && floor > x)) ? floor : x;
        }
    }
}

/* The terms of devices j and up. */
static struct terms
from_device(const struct terms *t, Py_ssize_t j)
{
    struct terms u = *t;
    u.base += j;
    u.inv += j;
    u.in_flight += j;
    if (u.pairs)
        u.pairs += 2 * j;
    if (u.minus)
        u.minus += j;
    if (u.parallel)
        u.parallel += j;
    return u;
}

#if defined(__GNUC__)
/* Four devices at a time in vector registers: compilers vectorise neither a floating-point min
 * nor a sum without giving up IEEE semantics, so the lanes are written out. */
typedef double v4d __attribute__((vector_size(32)));
typedef long long v4i __attribute__((vector_size(32)));
#define LANES 4
#if defined(__clang__)
#define SHUFFLE(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define SHUFFLE(a, b, i, j, k, l) __builtin_shuffle(a, b, (v4i){i, j, k, l})
#endif

/* The lowest score each lane saw and where (x < m picks x exactly as `<` does, so a lane keeps
 * its first lowest), and whether it saw a NaN. */
struct lanes {
    v4d low;
    v4i at, here, unordered;
};

static inline void
track(struct lanes *l, const v4d *score)
{
    v4d x = *score;
    v4i less = x < l->low;
    l->low = (v4d)((less & (v4i)x) | (~less & (v4i)l->low));
    l->at = (less & l->here) | (~less & l->at);
    l->unordered |= x != x;
    l->here += (v4i){LANES, LANES, LANES, LANES};
}
#else
#define LANES 0
struct lanes {
    int unused;
};
#endif

/* argmin's answer where it is a device, from the lanes' findings up to j and s[j:n]: the first
 * position of the lowest score, or -1 when none is finite or a score is NaN (argmin would pick
 * the NaN). */
static Py_ssize_t
finish(const struct lanes *l, const double *s, Py_ssize_t j, Py_ssize_t n)
{
    double low = INFINITY;
    Py_ssize_t best = -1;
    int nan = 0;
#if defined(__GNUC__)
    if (j > 0)
        for (int lane = 0; lane < LANES; lane++) {
            nan |= l->unordered[lane] != 0;
            if (l->low[lane] < low || (l->low[lane] == low && l->at[lane] < best)) {
                low = l->low[lane];
                best = l->at[lane];
            }
        }
#else
    (void)l;
#endif
    for (; j < n; j++) {
        nan |= s[j] != s[j];
        if (s[j] < low) {
            low = s[j];
            best = j;
        }
    }
    return nan || !(low < INFINITY) ? -1 : best;
}

/* scores(), then the position of the lowest. */
DISPATCHED static Py_ssize_t
scores_lowest(double *restrict s, const struct terms *t, Py_ssize_t n)
{
    Py_ssize_t j = 0;
    struct lanes l;
#if defined(__GNUC__)
    l = (struct lanes){
        {INFINITY, INFINITY, INFINITY, INFINITY}, {-1, -1, -1, -1}, {0, 1, 2, 3}, {0, 0, 0, 0}};
    const double cost = t->cost;
    const v4d costs = {cost, cost, cost, cost}, as = {t->a, t->a, t->a, t->a};
    if (!t->minus && !t->parallel && cost != 0) {
        /* The usual cases in one pass, each score as scores() makes it. */
        v4d x, y, inv;
        if (t->pairs)
            for (; j + LANES <= n; j += LANES) {
                v4d low, high; /* four devices' (work below, items from) pairs */
                memcpy(&low, t->pairs + 2 * j, sizeof low);
                memcpy(&high, t->pairs + 2 * j + LANES, sizeof high);
                x = SHUFFLE(low, high, 1, 3, 5, 7);
                x *= as;
                memcpy(&y, t->base + j, sizeof y);
                x += y;
                x += SHUFFLE(low, high, 0, 2, 4, 6);
                x += costs;
                memcpy(&inv, t->inv + j, sizeof inv);
                x *= inv;
                memcpy(s + j, &x, sizeof x);
                track(&l, &x);
            }
        else
            for (; j + LANES <= n; j += LANES) {
                memcpy(&x, t->base + j, sizeof x);
                x += costs;
                memcpy(&inv, t->inv + j, sizeof inv);
                x *= inv;
                memcpy(s + j, &x, sizeof x);
                track(&l, &x);
            }
        struct terms rest = from_device(t, j);
        scores(s + j, &rest, n - j);
        return finish(&l, s, j, n);
    }
    scores(s, t, n);
    for (; j + LANES <= n; j += LANES) {
        v4d x;
        memcpy(&x, s + j, sizeof x);
        track(&l, &x);
    }
#else
    scores(s, t, n);
#endif
    return finish(&l, s, j, n);
}

PyDoc_STRVAR(delay_doc,
"delay(out, base, inv, sums, k, minus, parallel, in_flight, cost, weight) -> int\n--\n\n"
"FleetView.delay_score into out; returns the position of the lowest score, or -1 when none is\n"
"finite (argmin's first minimum; a NaN anywhere counts as none).\n\n"
"Per device j, with a = cost * weight:\n"
"  score = sums[k][j][1] * a + base[j] + sums[k][j][0] + cost  (sums None: base[j] + cost)\n"
"  score -= minus[j]                                          (minus is not None)\n"
"  cost > 0:  score = max(score * inv[j], parallel[j] * (cost * inv[j]))  (parallel not None)\n"
"  cost == 0: score = inf where inv[j] is inf, else score * inv[j] + in_flight[j] * 1e-9");

enum { OUT, BASE, INV, SUMS, K, MINUS, PARALLEL, IN_FLIGHT, COST, WEIGHT, NARGS };

static PyObject *
delay(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != NARGS) {
        PyErr_Format(PyExc_TypeError, "delay() takes %d arguments (%zd given)", NARGS, nargs);
        return NULL;
    }
    struct terms t = {0};
    t.cost = PyFloat_AsDouble(args[COST]);
    double weight = PyFloat_AsDouble(args[WEIGHT]);
    Py_ssize_t k = PyLong_AsSsize_t(args[K]);
    if (PyErr_Occurred())
        return NULL;
    t.a = t.cost * weight;
    double *s = data_of(args[OUT], 0, NPY_FLOAT64, 1, "out");
    if (s == NULL)
        return NULL;
    npy_intp n = PyArray_SIZE((PyArrayObject *)args[OUT]);
    if (!(t.base = data_of(args[BASE], n, NPY_FLOAT64, 0, "base"))
        || !(t.inv = data_of(args[INV], n, NPY_FLOAT64, 0, "inv"))
        || !(t.in_flight = data_of(args[IN_FLIGHT], n, NPY_INT64, 0, "in_flight")))
        return NULL;
    if (args[SUMS] != Py_None) {
        if (k < 0) {
            PyErr_Format(PyExc_ValueError, "k: expected a row >= 0, got %zd", k);
            return NULL;
        }
        if (!(t.pairs = data_of(args[SUMS], (k + 1) * n * 2, NPY_FLOAT64, 0, "sums")))
            return NULL;
        t.pairs += k * n * 2;
    }
    if (args[MINUS] != Py_None && !(t.minus = data_of(args[MINUS], n, NPY_FLOAT64, 0, "minus")))
        return NULL;
    if (args[PARALLEL] != Py_None
        && !(t.parallel = data_of(args[PARALLEL], n, NPY_INT64, 0, "parallel")))
        return NULL;
    return PyLong_FromSsize_t(scores_lowest(s, &t, n));
}

static PyMethodDef methods[] = {
    {"note_queued", (PyCFunction)(void (*)(void))note_queued, METH_FASTCALL, note_queued_doc},
    {"delay", (PyCFunction)(void (*)(void))delay, METH_FASTCALL, delay_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "hetero.sched._kernel",
    "The placement hot path in C: delay scores and size-class sums (see view.py).",
    0,
    methods,
};

PyMODINIT_FUNC
PyInit__kernel(void)
{
    import_array();
    return PyModule_Create(&module);
}
