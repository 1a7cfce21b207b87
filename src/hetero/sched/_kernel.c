/* The scheduler's hot paths in C: the expected-delay score of every device and the size-class
 * sums it reads (hetero/sched/view.py); below them, the slo strategy's: the engine fit's update
 * (hetero/sched/engine_fit.py) and the usual pick (hetero/sched/policies/slo.py).
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

/* Whether a function that takes `want` arguments was given them; a TypeError saying so if not. */
static int
arity_ok(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
    return 0;
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
    if (!arity_ok("note_queued", nargs, 6))
        return NULL;
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
    if (!arity_ok("delay", nargs, NARGS))
        return NULL;
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

/* ---------------------------------------------------------------------------------------------
 * The engine fit's update (hetero/sched/engine_fit.py, LinearFit): the router learns from
 * every reply by a windowed least-squares solve with no coefficient below zero, on three or
 * four coefficients. In Python its loops over 4x4 sums and supports were most of the slo
 * strategy's cost per request. The arithmetic is engine_fit.py's, operation for operation and
 * in the same order, so the two agree bit for bit (tests/sched/test_kernel.py).
 */

#define FIT_MAX 4
#define FIT_MAX_SECONDS 3600.0 /* engine_fit.MAX_SECONDS */

/* The n floats of a list (or tuple) into out; -1 with an error naming it otherwise. */
static int
floats_of(PyObject *seq, Py_ssize_t n, double *out, const char *name)
{
    PyObject *fast = PySequence_Fast(seq, name);
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd values, got %zd", name, n,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyFloat_AsDouble(items[i]);
        if (out[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *
list_of(const double *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        PyObject *x = PyFloat_FromDouble(values[i]);
        if (x == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, x);
    }
    return list;
}

/* engine_fit._solve: m[idx, idx] theta = v[idx] by Cholesky; 0 when the block is not positive
 * definite or the answer not finite. */
static int
fit_solve(double m[FIT_MAX][FIT_MAX], const double *v, const int *idx, int n, double *theta)
{
    double low[FIT_MAX][FIT_MAX] = {{0}}, z[FIT_MAX];
    for (int r = 0; r < n; r++) {
        const double *mr = m[idx[r]];
        double *row = low[r];
        for (int c = 0; c <= r; c++) {
            double total = mr[idx[c]];
            const double *other = c < r ? low[c] : row;
            for (int k = 0; k < c; k++)
                total -= row[k] * other[k];
            if (r == c) {
                if (!(total > 1e-300))
                    return 0;
                row[r] = sqrt(total);
            }
            else
                row[c] = total / other[c];
        }
    }
    for (int r = 0; r < n; r++) {
        double total = v[idx[r]];
        for (int k = 0; k < r; k++)
            total -= low[r][k] * z[k];
        z[r] = total / low[r][r];
    }
    for (int r = n - 1; r >= 0; r--) {
        double total = z[r];
        for (int k = r + 1; k < n; k++)
            total -= low[k][r] * theta[k];
        theta[r] = total / low[r][r];
    }
    for (int r = 0; r < n; r++)
        if (!isfinite(theta[r]))
            return 0;
    return 1;
}

/* The supports of n coefficients as engine_fit._SUPPORTS orders them: by size, largest
 * first, each size in itertools.combinations' order. Returns how many. */
static int
fit_supports(int n, int sets[16][FIT_MAX], int sizes[16])
{
    int count = 0;
    for (int size = n; size >= 1; size--) {
        int idx[FIT_MAX];
        for (int i = 0; i < size; i++)
            idx[i] = i;
        for (;;) {
            memcpy(sets[count], idx, sizeof idx);
            sizes[count++] = size;
            int i = size - 1;
            while (i >= 0 && idx[i] == i + n - size)
                i--;
            if (i < 0)
                break;
            idx[i]++;
            for (int j = i + 1; j < size; j++)
                idx[j] = idx[j - 1] + 1;
        }
    }
    return count;
}

/* engine_fit._nonnegative, tried from the support `first` (size first_size; -1: none).
 * Returns 1 with theta and the support found, 0 when the numbers are lost. */
static int
fit_nonnegative(double m[FIT_MAX][FIT_MAX], const double *v, int n, const int *first,
                int first_size, double *theta, int *support, int *support_size)
{
    int sets[16][FIT_MAX], sizes[16];
    int count = fit_supports(n, sets, sizes);
    double top = fabs(v[0]);
    for (int i = 1; i < n; i++)
        if (fabs(v[i]) > top) /* Python's max: the first unless a later one is larger */
            top = fabs(v[i]);
    double tolerance = 1e-9 * (top + 1.0);
    for (int t = -1; t < count; t++) {
        const int *idx;
        int size;
        if (t < 0) { /* the last support first, then the others in their order */
            if (first_size <= 0)
                continue;
            idx = first, size = first_size;
        }
        else {
            if (first_size > 0 && sizes[t] == first_size
                && memcmp(sets[t], first, sizeof(int) * (size_t)first_size) == 0)
                continue;
            idx = sets[t], size = sizes[t];
        }
        double part[FIT_MAX];
        if (!fit_solve(m, v, idx, size, part))
            continue;
        int negative = 0;
        for (int i = 0; i < size; i++)
            negative |= part[i] < 0;
        if (negative)
            continue;
        int in[FIT_MAX] = {0};
        for (int i = 0; i < n; i++)
            theta[i] = 0.0;
        for (int i = 0; i < size; i++) {
            theta[idx[i]] = part[i];
            in[idx[i]] = 1;
        }
        int kkt = 1;
        for (int k = 0; size < n && k < n && kkt; k++) {
            if (in[k])
                continue;
            double total = 0.0;
            for (int i = 0; i < size; i++)
                total += m[k][idx[i]] * theta[idx[i]];
            kkt = total - v[k] >= -tolerance;
        }
        if (!kkt)
            continue;
        double most = theta[0];
        for (int i = 1; i < n; i++)
            if (theta[i] > most)
                most = theta[i];
        if (most > FIT_MAX_SECONDS)
            return 0;
        memcpy(support, idx, sizeof(int) * (size_t)size);
        *support_size = size;
        return 1;
    }
    for (int r = 0; r < n; r++) {
        if (!isfinite(v[r]))
            return 0;
        for (int c = 0; c < n; c++)
            if (!isfinite(m[r][c]))
                return 0;
    }
    for (int i = 0; i < n; i++)
        theta[i] = 0.0;
    *support_size = 0;
    return 1;
}

/* A reply (x, y, w) or None into xs, *y, *w. */
static int
reply_of(PyObject *reply, Py_ssize_t n, double *xs, double *y, double *w, const char *name)
{
    if (!PyTuple_Check(reply) || PyTuple_GET_SIZE(reply) != 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected (features, measured, weight) or None",
                     name);
        return -1;
    }
    if (floats_of(PyTuple_GET_ITEM(reply, 0), n, xs, name) < 0)
        return -1;
    *y = PyFloat_AsDouble(PyTuple_GET_ITEM(reply, 1));
    *w = PyFloat_AsDouble(PyTuple_GET_ITEM(reply, 2));
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(fit_step_doc,
"fit_step(a, b, add, drop, first)\n--\n\n"
"One update of engine_fit.LinearFit: its normal equations a (n x n lists) and b (n), n from 1\n"
"to 4, with the reply add = (x, y, w) in and drop = (x0, y0, w0) out (both or neither), each\n"
"entry ((a - w0 x0 x0) + w x x), then the least-squares coefficients with none below zero,\n"
"tried from the support first (a tuple of indices, or None). Returns (a, b, theta, support),\n"
"or None when the numbers are lost (engine_fit._nonnegative, in the same arithmetic).");

static PyObject *
fit_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!arity_ok("fit_step", nargs, 5))
        return NULL;
    Py_ssize_t n = PySequence_Length(args[1]);
    if (n < 0)
        return NULL;
    if (n < 1 || n > FIT_MAX) {
        PyErr_Format(PyExc_ValueError, "b: expected 1 to %d values, got %zd", FIT_MAX, n);
        return NULL;
    }
    double m[FIT_MAX][FIT_MAX], v[FIT_MAX];
    PyObject *rows = PySequence_Fast(args[0], "a");
    if (rows == NULL)
        return NULL;
    int bad = PySequence_Fast_GET_SIZE(rows) != n;
    if (bad)
        PyErr_Format(PyExc_ValueError, "a: expected %zd rows, got %zd", n,
                     PySequence_Fast_GET_SIZE(rows));
    for (Py_ssize_t r = 0; !bad && r < n; r++)
        bad = floats_of(PySequence_Fast_GET_ITEM(rows, r), n, m[r], "a") < 0;
    Py_DECREF(rows);
    if (bad || floats_of(args[1], n, v, "b") < 0)
        return NULL;
    int changed = args[2] != Py_None;
    if (changed != (args[3] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "add and drop: both a reply, or both None");
        return NULL;
    }
    if (changed) {
        double x[FIT_MAX], x0[FIT_MAX], y, w, y0, w0;
        if (reply_of(args[2], n, x, &y, &w, "add") < 0
            || reply_of(args[3], n, x0, &y0, &w0, "drop") < 0)
            return NULL;
        for (Py_ssize_t r = 0; r < n; r++) {
            double c0 = w0 * x0[r], c = w * x[r];
            for (Py_ssize_t k = 0; k < n; k++)
                m[r][k] = m[r][k] - c0 * x0[k] + c * x[k];
            v[r] = v[r] - w0 * y0 * x0[r] + w * y * x[r];
        }
    }
    int first[FIT_MAX], first_size = -1;
    if (args[4] != Py_None) {
        PyObject *fast = PySequence_Fast(args[4], "first");
        if (fast == NULL)
            return NULL;
        first_size = (int)PySequence_Fast_GET_SIZE(fast);
        for (int i = 0; i < first_size && i < n; i++)
            first[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        Py_DECREF(fast);
        if (PyErr_Occurred())
            return NULL;
        int bad_first = first_size > n;
        for (int i = 0; !bad_first && i < first_size; i++)
            bad_first = first[i] < 0 || first[i] >= n || (i && first[i] <= first[i - 1]);
        if (bad_first) {
            PyErr_Format(PyExc_ValueError, "first: expected increasing indices below %zd, or None",
                         n);
            return NULL;
        }
    }
    double theta[FIT_MAX];
    int support[FIT_MAX], size = 0;
    if (!fit_nonnegative(m, v, (int)n, first, first_size, theta, support, &size))
        Py_RETURN_NONE;
    PyObject *a = PyList_New(n), *b = list_of(v, n), *coef = list_of(theta, n);
    PyObject *chosen = PyTuple_New(size);
    for (Py_ssize_t r = 0; a != NULL && r < n; r++) {
        PyObject *row = list_of(m[r], n);
        if (row == NULL) {
            Py_CLEAR(a);
            break;
        }
        PyList_SET_ITEM(a, r, row);
    }
    for (int i = 0; chosen != NULL && i < size; i++) {
        PyObject *k = PyLong_FromLong(support[i]);
        if (k == NULL) {
            Py_CLEAR(chosen);
            break;
        }
        PyTuple_SET_ITEM(chosen, i, k);
    }
    if (a == NULL || b == NULL || coef == NULL || chosen == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(coef);
        Py_XDECREF(chosen);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", a, b, coef, chosen);
}

/* ---------------------------------------------------------------------------------------------
 * The slo strategy's pick where some replica meets the SLO (hetero/sched/policies/slo.py,
 * SloRouting.pick): every replica's predicted TTFT and TPOT from its columns and the request's
 * own terms, and the one with the most headroom among those whose predictions meet both
 * targets. In numpy that is some twenty operations, each costing its call overhead at any
 * fleet size; here one pass. The arithmetic is the numpy expressions', in the same order, with
 * numpy's NaN rules (maximum and minimum propagate a NaN, argmin picks the first NaN), so the
 * pick is the same; the time decay of the prefill rate comes computed by numpy (its exp is not
 * the C library's to the last bit).
 */

#define SLO_FLOOR 1e-4           /* engine_fit.FLOOR */
#define SLO_MAX_TOKENS 1e9       /* engine_fit.MAX_TOKENS */

static inline double
np_maximum(double a, double b)
{
    return a != a ? a : b != b ? b : a >= b ? a : b;
}

static inline double
np_minimum(double a, double b)
{
    return a != a ? a : b != b ? b : a <= b ? a : b;
}

PyDoc_STRVAR(slo_pick_doc,
"slo_pick(ttft_base, per_token, step_base, per_kv, prefill, decay, ttft_gate, tpot_gate,\n"
"         kv_room, usable, uncached, ttft_slo, tpot_slo, kv_feature, need)\n--\n\n"
"Per replica j < len(usable) (float64 columns, usable bool; uncached a float or a float64\n"
"array):\n"
"  ttft_s = max(1e-4, ttft_base + min(uncached, 1e9) * per_token)\n"
"  tpot_s = max(1e-4, step_base + per_kv * kv_feature) + min(3600, prefill * decay)\n"
"  ttft = ttft_s / ttft_slo; tpot = tpot_s / tpot_slo, times 10 where kv_room < need (if the\n"
"  least kv_room is)\n"
"  meets = usable and max(ttft * ttft_gate, tpot * tpot_gate) <= 1\n"
"Returns (j, ttft_s, tpot_s) for the first j of the least ttft + tpot among those that meet,\n"
"or None when none does.");

enum {
    P_TTFT_BASE, P_PER_TOKEN, P_STEP_BASE, P_PER_KV, P_PREFILL, P_DECAY, P_TTFT_GATE,
    P_TPOT_GATE, P_KV_ROOM, P_USABLE, P_UNCACHED, P_TTFT_SLO, P_TPOT_SLO, P_KV_FEATURE, P_NEED,
    P_NARGS
};

static PyObject *
slo_pick(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!arity_ok("slo_pick", nargs, P_NARGS))
        return NULL;
    static const char *names[] = {"ttft_base", "per_token", "step_base", "per_kv", "prefill",
                                  "decay", "ttft_gate", "tpot_gate", "kv_room"};
    if (!PyArray_Check(args[P_USABLE]) || PyArray_TYPE((PyArrayObject *)args[P_USABLE]) != NPY_BOOL
        || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)args[P_USABLE])) {
        PyErr_SetString(PyExc_ValueError, "usable: expected a C-contiguous numpy bool array");
        return NULL;
    }
    npy_intp n = PyArray_SIZE((PyArrayObject *)args[P_USABLE]);
    const npy_bool *usable = PyArray_DATA((PyArrayObject *)args[P_USABLE]);
    const double *col[P_USABLE];
    for (int k = 0; k < P_USABLE; k++)
        if (!(col[k] = data_of(args[k], n, NPY_FLOAT64, 0, names[k])))
            return NULL;
    const double *uncached_of = NULL;
    double uncached = 0.0;
    if (PyArray_Check(args[P_UNCACHED])) {
        if (!(uncached_of = data_of(args[P_UNCACHED], n, NPY_FLOAT64, 0, "uncached")))
            return NULL;
    }
    else
        uncached = PyFloat_AsDouble(args[P_UNCACHED]);
    double ttft_slo = PyFloat_AsDouble(args[P_TTFT_SLO]);
    double tpot_slo = PyFloat_AsDouble(args[P_TPOT_SLO]);
    double kv_feature = PyFloat_AsDouble(args[P_KV_FEATURE]);
    double need = PyFloat_AsDouble(args[P_NEED]);
    if (PyErr_Occurred())
        return NULL;
    /* Python's min(uncached, MAX_TOKENS) for the one number; numpy's minimum for an array. */
    double own_tokens = SLO_MAX_TOKENS < uncached ? SLO_MAX_TOKENS : uncached;
    /* numpy's kv_room.min(): the least, or the first NaN. */
    double least = n ? col[P_KV_ROOM][0] : INFINITY;
    for (npy_intp j = 1; j < n && least == least; j++)
        least = np_minimum(least, col[P_KV_ROOM][j]);
    int queues = n > 0 && least < need;
    npy_intp best = -1;
    double low = INFINITY, best_ttft = 0.0, best_tpot = 0.0;
    for (npy_intp j = 0; j < n; j++) {
        if (!usable[j])
            continue;
        double tokens = uncached_of ? np_minimum(uncached_of[j], SLO_MAX_TOKENS) : own_tokens;
        double ttft_s = np_maximum(SLO_FLOOR, col[P_TTFT_BASE][j] + tokens * col[P_PER_TOKEN][j]);
        double step = np_maximum(SLO_FLOOR, col[P_STEP_BASE][j] + col[P_PER_KV][j] * kv_feature);
        double tpot_s = step + np_minimum(FIT_MAX_SECONDS, col[P_PREFILL][j] * col[P_DECAY][j]);
        double ttft = ttft_s / ttft_slo, tpot = tpot_s / tpot_slo;
        if (queues && col[P_KV_ROOM][j] < need)
            tpot *= 10.0;
        double worst = np_maximum(ttft * col[P_TTFT_GATE][j], tpot * col[P_TPOT_GATE][j]);
        if (!(worst <= 1.0))
            continue;
        double headroom = ttft + tpot;
        if (headroom != headroom || best < 0 || headroom < low) {
            best = j, low = headroom, best_ttft = ttft_s, best_tpot = tpot_s;
            if (headroom != headroom)
                break; /* argmin's first NaN */
        }
    }
    if (best < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ndd)", (Py_ssize_t)best, best_ttft, best_tpot);
}

PyDoc_STRVAR(slo_targets_doc,
"slo_targets(lone_ttft, per_token, step_base, per_request, per_kv, order, n,\n"
"            prompt_feature, kv_feature, knee)\n--\n\n"
"What the slo strategy derives its targets from where none are given (SloRouting.slo),\n"
"over replicas j < n (float64 columns):\n"
"  ttft = max(1e-4, min(3600, min(3600, min_j lone_ttft + per_token * prompt_feature)))\n"
"with numpy's min (a NaN wins) and Python's min and max after it (a NaN loses to 3600);\n"
"  tpot = max(1e-4, min(3600, the least step s at which the replicas together reach knee of\n"
"         their top decode throughput)),\n"
"each replica's step a_j + c_j * batch (a_j = step_base, c_j = per_request + per_kv *\n"
"kv_feature) running (s - a_j) / c_j requests once s reaches its lone step a_j + c_j. Only\n"
"replicas with a_j >= 0, c_j >= 1e-9 and a lone step below 3600 count (3600 if none does);\n"
"taken in order of lone step (index on ties), sums in that order, as SloRouting's numpy.\n"
"order (int64, writable): replicas 0..n-1 in that order as the last call left them, sorted\n"
"again (those that count first) only where they are not.");

/* numpy's min(initial=3600) of a + b * x over j < n, then Python's max(1e-4, min(3600, it)). */
static double
lone_best(const double *a, const double *b, npy_intp n, double x)
{
    double low = FIT_MAX_SECONDS;
    for (npy_intp j = 0; j < n && low == low; j++)
        low = np_minimum(low, a[j] + b[j] * x);
    double capped = low < FIT_MAX_SECONDS ? low : FIT_MAX_SECONDS; /* min(3600, NaN) is 3600 */
    return SLO_FLOOR < capped ? capped : SLO_FLOOR;
}

#define SLO_LEAST_COST 1e-9 /* slo._LEAST_COST */

typedef struct {
    double lone;
    npy_intp j;
} knee_row;

static int
knee_order(const void *x, const void *y)
{
    const knee_row *a = x, *b = y;
    if (a->lone != b->lone)
        return a->lone < b->lone ? -1 : 1;
    return a->j < b->j ? -1 : a->j > b->j;
}

/* Replica j's cost a request (c) and lone step, and whether it counts toward the target. */
static inline int
knee_terms(const double *base, const double *per_request, const double *per_kv, npy_intp j,
           double kv, double *cost, double *lone)
{
    *cost = per_request[j] + per_kv[j] * kv;
    *lone = base[j] + *cost;
    return base[j] >= 0.0 && *cost >= SLO_LEAST_COST && *lone < FIT_MAX_SECONDS;
}

/* Whether order[0..n) lists replicas 0..n-1 with those that count in order of (lone step,
 * index), as it does after the last request unless the request's KV tokens or a reference
 * reordered them; *top: the sum of 1 / c over those that count, in that order. */
static int
knee_sorted(const double *base, const double *per_request, const double *per_kv,
            const npy_int64 *order, npy_intp n, double kv, double *top)
{
    double last = -1.0, cost, lone;
    npy_intp last_j = -1;
    *top = 0.0;
    for (npy_intp k = 0; k < n; k++) {
        npy_intp j = (npy_intp)order[k];
        if (j < 0 || j >= n)
            return 0;
        if (!knee_terms(base, per_request, per_kv, j, kv, &cost, &lone))
            continue;
        if (lone < last || (lone == last && j <= last_j))
            return 0;
        last = lone, last_j = j;
        *top += 1.0 / cost;
    }
    return 1;
}

/* Writes into order the replicas that count, by (lone step, index), then the others; 0 with
 * MemoryError. */
static int
knee_sort(const double *base, const double *per_request, const double *per_kv, npy_int64 *order,
          npy_intp n, double kv)
{
    knee_row *rows = PyMem_Malloc(sizeof(knee_row) * (size_t)(n > 0 ? n : 1));
    if (rows == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    npy_intp m = 0, rest = n;
    double cost, lone;
    for (npy_intp j = 0; j < n; j++) {
        if (knee_terms(base, per_request, per_kv, j, kv, &cost, &lone))
            rows[m++] = (knee_row){lone, j};
        else
            order[--rest] = j;
    }
    qsort(rows, (size_t)m, sizeof(knee_row), knee_order);
    for (npy_intp k = 0; k < m; k++)
        order[k] = rows[k].j;
    PyMem_Free(rows);
    return 1;
}

/* The least s >= some replica's lone step at which the sum over those with lone <= s of
 * (1 - a / s) / c reaches knee of the sum of 1 / c (see slo_targets_doc); -1 with an error
 * set. order: the replicas' order by lone step, kept between calls (sorted again only when
 * it is not). */
static double
knee_step(const double *base, const double *per_request, const double *per_kv, npy_int64 *order,
          npy_intp n, double kv, double knee)
{
    double top, cost, lone;
    if (!knee_sorted(base, per_request, per_kv, order, n, kv, &top)) {
        if (!knee_sort(base, per_request, per_kv, order, n, kv))
            return -1.0;
        knee_sorted(base, per_request, per_kv, order, n, kv, &top); /* sorted now: its sum */
    }
    double need = knee * top, rate = 0.0, fixed = 0.0, best = FIT_MAX_SECONDS;
    for (npy_intp k = 0; k < n; k++) {
        npy_intp j = (npy_intp)order[k];
        if (!knee_terms(base, per_request, per_kv, j, kv, &cost, &lone))
            continue;
        rate += 1.0 / cost;
        fixed += base[j] / cost;
        double spare = rate - need;
        if (spare > 0.0) {
            double s = fixed / spare;
            s = s > lone ? s : lone;
            best = s < best ? s : best;
        }
    }
    double capped = best < FIT_MAX_SECONDS ? best : FIT_MAX_SECONDS;
    return SLO_FLOOR < capped ? capped : SLO_FLOOR;
}

static PyObject *
slo_targets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (!arity_ok("slo_targets", nargs, 10))
        return NULL;
    npy_intp n = PyLong_AsSsize_t(args[6]);
    double prompt = PyFloat_AsDouble(args[7]), kv = PyFloat_AsDouble(args[8]);
    double knee = PyFloat_AsDouble(args[9]);
    if (PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "n: expected a count of replicas >= 0, got %zd", n);
        return NULL;
    }
    static const char *names[] = {"lone_ttft", "per_token", "step_base", "per_request", "per_kv"};
    const double *col[5];
    for (int k = 0; k < 5; k++)
        if (!(col[k] = data_of(args[k], n, NPY_FLOAT64, 0, names[k])))
            return NULL;
    npy_int64 *order = data_of(args[5], n, NPY_INT64, 1, "order");
    if (order == NULL)
        return NULL;
    double tpot = knee_step(col[2], col[3], col[4], order, n, kv, knee);
    if (tpot < 0)
        return NULL;
    return Py_BuildValue("(dd)", lone_best(col[0], col[1], n, prompt), tpot);
}

static PyMethodDef methods[] = {
    {"note_queued", (PyCFunction)(void (*)(void))note_queued, METH_FASTCALL, note_queued_doc},
    {"delay", (PyCFunction)(void (*)(void))delay, METH_FASTCALL, delay_doc},
    {"fit_step", (PyCFunction)(void (*)(void))fit_step, METH_FASTCALL, fit_step_doc},
    {"slo_pick", (PyCFunction)(void (*)(void))slo_pick, METH_FASTCALL, slo_pick_doc},
    {"slo_targets", (PyCFunction)(void (*)(void))slo_targets, METH_FASTCALL, slo_targets_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "hetero.sched._kernel",
    "The scheduler's hot paths in C: delay scores and size-class sums (view.py), the engine "
    "fit's update (engine_fit.py), the slo strategy's usual pick and derived targets "
    "(policies/slo.py).",
    0,
    methods,
};

PyMODINIT_FUNC
PyInit__kernel(void)
{
    import_array();
    return PyModule_Create(&module);
}
