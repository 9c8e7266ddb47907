/*
 * The MCB packing kernel in C (paper section 3.4); the reference is
 * vcsched.solvers.mcb.pack_python and the two must make exactly the same decisions.
 *
 * pack(cpu, mem, cpu_heavy, mem_heavy, host_cpu, host_mem, eps, out[, group, host_ptr, host_groups]) -> bool
 *
 *   cpu, mem            float64 per task: c = Y * alpha and m for this probe
 *   cpu_heavy,
 *   mem_heavy           int64 task indices, each list already sorted in scan order
 *   host_cpu, host_mem  float64 capacities per host, filled in index order
 *   eps                 fit tolerance: a task fits when c <= free_c + eps and m <= free_m + eps
 *   out                 writable int64 per task: the host of each task (-1 when left over)
 *   group               optional int64 per task: its spread group (docs/rules.md), -1 for none; a task is
 *                       skipped on a host that already holds a task of its group
 *   host_ptr,
 *   host_groups         optional int64 CSR: the groups already on host h (pinned tasks) are
 *                       host_groups[host_ptr[h] .. host_ptr[h + 1])
 *
 * Returns True when every task is placed.  Arrays are taken through the
 * buffer protocol (no numpy headers); the Python wrapper guarantees dtypes,
 * this file checks sizes and index ranges.
 *
 * Why it is fast: the reference scans a list from its start on every
 * search, O(n) each.  Here each list is a min-tree (below), so a search skips
 * whole runs of placed or too-large tasks and costs about O(log n).
 *
 * pack_vector (below) is the same packing on resource vectors of any
 * dimension; pack is its two-dimensional case, and both run one core
 * (pack_lists), so the two cannot drift apart.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * One list as a min-tree over its positions: leaf p holds the need of the task
 * at position p on each dimension (+inf once placed); an inner node holds the
 * minima of its subtree, dimension by dimension.  The first live task in list
 * order that fits is the leftmost leaf whose every need is <= its limit; a
 * subtree whose smallest need on some dimension is not <= the limit holds no
 * such task and is skipped.
 * The leaf test is the reference's comparison, so the choice is the same.
 * "not <=" rather than ">": a comparison with NaN is false, so a NaN limit
 * (a NaN capacity) fits nothing, as in the reference.  A limit is never +inf
 * (clamped to DBL_MAX: fit_limit), so a placed task's +inf never fits;
 * needs are finite.
 */
static inline double dmin(double a, double b) { return a < b ? a : b; }

/* The limit a need is compared with: free + eps, an infinite one clamped to DBL_MAX (any finite need
 * fits, a placed task's +inf does not), NaN kept (nothing fits). */
static inline double fit_limit(double x) { return x > DBL_MAX ? DBL_MAX : x; }

/* A C-contiguous buffer of 8-byte items of the given kind: 'd' float64, 'i' int64. */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, char kind, const char *name, Py_ssize_t *count)
{
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = view->itemsize == 8 && f[1] == '\0' &&
             (kind == 'd' ? *f == 'd' : (*f == 'q' || *f == 'l'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous %s array, got format '%s' with %zd-byte items", name,
                     kind == 'd' ? "float64" : "int64", view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *count = view->len / 8;
    return 0;
}

/*
 * The spread-group marks of a kernel call: checks group (one per task) and the CSR host_ptr / host_groups
 * (host_ptr: n_hosts + 1 entries), then returns mark[g] = -1 for every group g (g's last host, as the
 * packing goes), or NULL with a Python exception set.  fn names the caller in the messages.
 */
static int64_t *spread_marks(const char *fn, const int64_t *group, Py_ssize_t n_group, Py_ssize_t n_tasks,
                             const int64_t *host_ptr, Py_ssize_t n_ptr, Py_ssize_t n_hosts,
                             const int64_t *host_groups, Py_ssize_t n_host_groups)
{
    if (n_group != n_tasks || n_ptr != n_hosts + 1) {
        PyErr_Format(PyExc_ValueError, "%s: group needs one entry per task, host_ptr n_hosts + 1", fn);
        return NULL;
    }
    Py_ssize_t n_groups = 0;
    for (Py_ssize_t t = 0; t < n_tasks; t++)
        if (group[t] + 1 > n_groups)
            n_groups = group[t] + 1;
    for (Py_ssize_t i = 0; i < n_host_groups; i++)
        if (host_groups[i] + 1 > n_groups)
            n_groups = host_groups[i] + 1;
    for (Py_ssize_t h = 0; h <= n_hosts; h++)
        if (host_ptr[h] < 0 || host_ptr[h] > n_host_groups || (h > 0 && host_ptr[h] < host_ptr[h - 1])) {
            PyErr_Format(PyExc_ValueError, "%s: host_ptr is not a CSR index into host_groups", fn);
            return NULL;
        }
    int64_t *mark = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_groups > 0 ? n_groups : 1));
    if (mark == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t g = 0; g < n_groups; g++)
        mark[g] = -1;
    return mark;
}

typedef struct {
    const int64_t *task;
    Py_ssize_t size;
    double *mins; /* 2 * size nodes x d minima (d is passed along: a constant 2 from pack, which the compiler
                     then specialises) */
} VList;

static int vlist_init(VList *l, const int64_t *task, Py_ssize_t n, const double *need, int d)
{
    l->task = task;
    l->size = 1;
    while (l->size < n)
        l->size *= 2;
    l->mins = (double *)malloc(sizeof(double) * 2 * (size_t)l->size * (size_t)d);
    if (l->mins == NULL)
        return -1;
    for (Py_ssize_t p = 0; p < l->size; p++)
        for (int k = 0; k < d; k++)
            l->mins[(l->size + p) * d + k] = p < n ? need[task[p] * d + k] : HUGE_VAL;
    for (Py_ssize_t i = l->size - 1; i >= 1; i--)
        for (int k = 0; k < d; k++)
            l->mins[i * d + k] = dmin(l->mins[2 * i * d + k], l->mins[(2 * i + 1) * d + k]);
    return 0;
}

static inline int vnode_may_fit(const VList *l, int d, Py_ssize_t node, const double *limit)
{
    const double *m = l->mins + node * d;
    for (int k = 0; k < d; k++)
        if (!(m[k] <= limit[k])) /* also when a limit is NaN */
            return 0;
    return 1;
}

/* Leftmost position under node whose task fits, or -1 (the search of every pick; the one above skips a task). */
static Py_ssize_t vlist_find(const VList *l, int d, Py_ssize_t node, const double *limit)
{
    if (!vnode_may_fit(l, d, node, limit))
        return -1;
    if (node >= l->size)
        return node - l->size;
    Py_ssize_t p = vlist_find(l, d, 2 * node, limit);
    return p >= 0 ? p : vlist_find(l, d, 2 * node + 1, limit);
}

/* Leftmost position > after under node (covering [lo, lo + width)) whose task fits, or -1. */
static Py_ssize_t vlist_find_after(const VList *l, int d, Py_ssize_t node, Py_ssize_t lo, Py_ssize_t width,
                                   Py_ssize_t after, const double *limit)
{
    if (lo + width - 1 <= after || !vnode_may_fit(l, d, node, limit))
        return -1;
    if (node >= l->size)
        return node - l->size;
    Py_ssize_t half = width / 2;
    Py_ssize_t p = vlist_find_after(l, d, 2 * node, lo, half, after, limit);
    return p >= 0 ? p : vlist_find_after(l, d, 2 * node + 1, lo + half, half, after, limit);
}

static void vlist_take(VList *l, int d, Py_ssize_t p)
{
    Py_ssize_t i = l->size + p;
    for (int k = 0; k < d; k++)
        l->mins[i * d + k] = HUGE_VAL;
    for (i /= 2; i >= 1; i /= 2)
        for (int k = 0; k < d; k++)
            l->mins[i * d + k] = dmin(l->mins[2 * i * d + k], l->mins[(2 * i + 1) * d + k]);
}

/*
 * The same packing on resource vectors of any dimension d (the reference is
 * vcsched.solvers.mcb_vector.pack_vector_python; the two must make exactly the same decisions).
 *
 * pack_vector(need, d, order, list_ptr, capacity, eps, out[, group, host_ptr, host_groups]) -> bool
 *
 *   need        float64 n x d (row-major): each task's need on each dimension for this probe
 *   order       int64 n: the d lists one after another, each in scan order
 *   list_ptr    int64 d + 1: list k is order[list_ptr[k] .. list_ptr[k + 1])
 *   capacity    float64 hosts x d, filled in index order
 *   eps, out, group, host_ptr, host_groups: as for pack
 *
 * A host's first task comes from list 0, then 1, ...; each later one from the list of the dimension with the
 * most free capacity first (ties: the later dimension), then the next most free, and so on.
 */
/*
 * The packing itself, for pack and pack_vector: hosts filled in index order from the d lists (order,
 * list_ptr) of the tasks' needs (n x d) within the hosts' capacities (hosts x d); out[t] = the host of task t.
 * mark: spread-group marks from spread_marks, or NULL without rules.  Returns 1 when every task is placed,
 * 0 when some is left over, -1 with a Python exception set (bad order, no memory).
 */
static int pack_lists(const double *need, int d, const int64_t *order, const int64_t *list_ptr, Py_ssize_t n_tasks,
                      const double *capacity, Py_ssize_t n_hosts, double eps, int64_t *out, const int64_t *group,
                      const int64_t *host_ptr, const int64_t *host_groups, int64_t *mark, const char *fn)
{
    int status = -1;
    VList *lists = NULL;
    double *free_ = NULL, *limit = NULL;
    int *scan = NULL;

    for (Py_ssize_t t = 0; t < n_tasks; t++)
        out[t] = -1;
    for (Py_ssize_t i = 0; i < n_tasks; i++) {
        if (order[i] < 0 || order[i] >= n_tasks || out[order[i]] != -1) {
            PyErr_Format(PyExc_ValueError, "%s: task index %lld (at %zd of the lists) is out of range or repeated",
                         fn, (long long)order[i], i);
            goto done;
        }
        out[order[i]] = -2; /* the lists must partition the tasks */
    }
    for (Py_ssize_t t = 0; t < n_tasks; t++)
        out[t] = -1;
    lists = (VList *)calloc((size_t)d, sizeof(VList));
    free_ = (double *)malloc(sizeof(double) * (size_t)d);
    limit = (double *)malloc(sizeof(double) * (size_t)d);
    scan = (int *)malloc(sizeof(int) * (size_t)d);
    if (lists == NULL || free_ == NULL || limit == NULL || scan == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int k = 0; k < d; k++)
        if (vlist_init(&lists[k], order + list_ptr[k], list_ptr[k + 1] - list_ptr[k], need, d) < 0) {
            PyErr_NoMemory();
            goto done;
        }

    Py_ssize_t left = n_tasks;
    for (Py_ssize_t h = 0; h < n_hosts && left > 0; h++) {
        for (int k = 0; k < d; k++)
            free_[k] = capacity[h * d + k];
        int first = 1;
        if (mark != NULL)
            for (int64_t i = host_ptr[h]; i < host_ptr[h + 1]; i++)
                if (host_groups[i] >= 0)
                    mark[host_groups[i]] = (int64_t)h;
        while (left > 0) {
            for (int k = 0; k < d; k++) {
                limit[k] = fit_limit(free_[k] + eps);
                scan[k] = k;
            }
            if (!first) /* most free dimension first, ties to the later one: insertion sort, d is small */
                for (int i = 1; i < d; i++)
                    for (int j = i; j > 0; j--) {
                        int a = scan[j - 1], b = scan[j];
                        /* b goes before a when it has more free capacity, or as much and is later */
                        if (free_[b] > free_[a] || (free_[b] == free_[a] && b > a)) {
                            scan[j - 1] = b;
                            scan[j] = a;
                        } else
                            break;
                    }
            Py_ssize_t p = -1;
            int li = 0;
            for (int s = 0; s < d && p < 0; s++) {
                li = scan[s];
                VList *l = &lists[li];
                p = vlist_find(l, d, 1, limit);
                /* A task whose spread group is already on this host is skipped: the next fitting one. */
                while (mark != NULL && p >= 0 && group[l->task[p]] >= 0 && mark[group[l->task[p]]] == (int64_t)h)
                    p = vlist_find_after(l, d, 1, 0, l->size, p, limit);
            }
            if (p < 0)
                break; /* nothing fits: next host */
            int64_t t = lists[li].task[p];
            vlist_take(&lists[li], d, p);
            out[t] = (int64_t)h;
            if (mark != NULL && group[t] >= 0)
                mark[group[t]] = (int64_t)h;
            for (int k = 0; k < d; k++)
                free_[k] -= need[t * d + k];
            left--;
            first = 0;
        }
    }
    status = left == 0;

done:
    if (lists != NULL)
        for (int k = 0; k < d; k++)
            free(lists[k].mins);
    free(lists);
    free(free_);
    free(limit);
    free(scan);
    return status;
}

/* The optional rules arguments of both kernels: group, host_ptr, host_groups (all three or none). */
static int rules_given(PyObject *const o_rules[3], const char *fn)
{
    if (o_rules[0] != NULL && (o_rules[1] == NULL || o_rules[2] == NULL)) {
        PyErr_Format(PyExc_TypeError, "%s: group, host_ptr and host_groups go together", fn);
        return -1;
    }
    return o_rules[0] != NULL;
}

static PyObject *pack(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[6], *o_out, *o_rules[3] = {NULL, NULL, NULL};
    double eps;
    if (!PyArg_ParseTuple(args, "OOOOOOdO|OOO:pack", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &eps, &o_out,
                          &o_rules[0], &o_rules[1], &o_rules[2]))
        return NULL;
    static const char *names[10] = {"cpu",      "mem", "cpu_heavy", "mem_heavy", "host_cpu", "host_mem", "out",
                                    "group", "host_ptr", "host_groups"};
    static const char kinds[10] = {'d', 'd', 'i', 'i', 'd', 'd', 'i', 'i', 'i', 'i'};
    PyObject *objs[10] = {o[0], o[1], o[2], o[3], o[4], o[5], o_out, o_rules[0], o_rules[1], o_rules[2]};
    Py_buffer v[10];
    Py_ssize_t n[10];
    int got = 0;
    int64_t *mark = NULL, *order = NULL;
    double *need = NULL, *capacity = NULL;
    PyObject *result = NULL;
    int has_rules = rules_given(o_rules, "pack");
    if (has_rules < 0)
        return NULL;
    for (int want = has_rules ? 10 : 7; got < want; got++)
        if (get_buffer(objs[got], &v[got], got == 6, kinds[got], names[got], &n[got]) < 0)
            goto done;

    Py_ssize_t n_tasks = n[0], n_hosts = n[4];
    if (n[1] != n_tasks || n[6] != n_tasks || n[2] + n[3] != n_tasks || n[5] != n_hosts) {
        PyErr_SetString(PyExc_ValueError, "pack: inconsistent array lengths");
        goto done;
    }
    if (has_rules) {
        mark = spread_marks("pack", (const int64_t *)v[7].buf, n[7], n_tasks, (const int64_t *)v[8].buf, n[8], n_hosts,
                            (const int64_t *)v[9].buf, n[9]);
        if (mark == NULL)
            goto done;
    }
    /* The two-dimensional case of pack_lists: (cpu, mem) pairs, the CPU-heavy list then the memory-heavy one. */
    need = (double *)malloc(sizeof(double) * 2 * (size_t)(n_tasks > 0 ? n_tasks : 1));
    capacity = (double *)malloc(sizeof(double) * 2 * (size_t)(n_hosts > 0 ? n_hosts : 1));
    order = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_tasks > 0 ? n_tasks : 1));
    if (need == NULL || capacity == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const double *cpu = (const double *)v[0].buf, *mem = (const double *)v[1].buf;
    const double *hcpu = (const double *)v[4].buf, *hmem = (const double *)v[5].buf;
    for (Py_ssize_t t = 0; t < n_tasks; t++) {
        need[2 * t] = cpu[t];
        need[2 * t + 1] = mem[t];
    }
    for (Py_ssize_t h = 0; h < n_hosts; h++) {
        capacity[2 * h] = hcpu[h];
        capacity[2 * h + 1] = hmem[h];
    }
    memcpy(order, v[2].buf, sizeof(int64_t) * (size_t)n[2]);
    memcpy(order + n[2], v[3].buf, sizeof(int64_t) * (size_t)n[3]);
    int64_t list_ptr[3] = {0, n[2], n_tasks};
    int status = pack_lists(need, 2, order, list_ptr, n_tasks, capacity, n_hosts, eps, (int64_t *)v[6].buf,
                            has_rules ? (const int64_t *)v[7].buf : NULL, has_rules ? (const int64_t *)v[8].buf : NULL,
                            has_rules ? (const int64_t *)v[9].buf : NULL, mark, "pack");
    if (status >= 0)
        result = PyBool_FromLong(status);

done:
    free(mark);
    free(need);
    free(capacity);
    free(order);
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return result;
}

static PyObject *pack_vector(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_need, *o_order, *o_ptr, *o_cap, *o_out, *o_rules[3] = {NULL, NULL, NULL};
    int d;
    double eps;
    if (!PyArg_ParseTuple(args, "OiOOOdO|OOO:pack_vector", &o_need, &d, &o_order, &o_ptr, &o_cap, &eps, &o_out,
                          &o_rules[0], &o_rules[1], &o_rules[2]))
        return NULL;
    PyObject *objs[8] = {o_need, o_order, o_ptr, o_cap, o_out, o_rules[0], o_rules[1], o_rules[2]};
    static const char *names[8] = {"need", "order", "list_ptr", "capacity", "out", "group", "host_ptr",
                                   "host_groups"};
    static const char kinds[8] = {'d', 'i', 'i', 'd', 'i', 'i', 'i', 'i'};
    Py_buffer v[8];
    Py_ssize_t n[8];
    int got = 0;
    int64_t *mark = NULL;
    PyObject *result = NULL;

    if (d < 1) {
        PyErr_SetString(PyExc_ValueError, "pack_vector: d must be at least 1");
        return NULL;
    }
    int has_rules = rules_given(o_rules, "pack_vector");
    if (has_rules < 0)
        return NULL;
    for (int want = has_rules ? 8 : 5; got < want; got++)
        if (get_buffer(objs[got], &v[got], got == 4, kinds[got], names[got], &n[got]) < 0)
            goto done;

    Py_ssize_t n_tasks = n[1], n_hosts = n[3] / d;
    if (n[0] != n_tasks * d || n[3] != n_hosts * d || n[4] != n_tasks || n[2] != d + 1) {
        PyErr_SetString(PyExc_ValueError, "pack_vector: inconsistent array lengths");
        goto done;
    }
    const int64_t *list_ptr = (const int64_t *)v[2].buf;
    if (list_ptr[0] != 0 || list_ptr[d] != n_tasks) {
        PyErr_SetString(PyExc_ValueError, "pack_vector: list_ptr must run from 0 to the number of tasks");
        goto done;
    }
    for (int k = 0; k < d; k++)
        if (list_ptr[k + 1] < list_ptr[k]) {
            PyErr_SetString(PyExc_ValueError, "pack_vector: list_ptr is not increasing");
            goto done;
        }
    if (has_rules) {
        mark = spread_marks("pack_vector", (const int64_t *)v[5].buf, n[5], n_tasks, (const int64_t *)v[6].buf, n[6],
                            n_hosts, (const int64_t *)v[7].buf, n[7]);
        if (mark == NULL)
            goto done;
    }
    int status = pack_lists((const double *)v[0].buf, d, (const int64_t *)v[1].buf, list_ptr, n_tasks,
                            (const double *)v[3].buf, n_hosts, eps, (int64_t *)v[4].buf,
                            has_rules ? (const int64_t *)v[5].buf : NULL, has_rules ? (const int64_t *)v[6].buf : NULL,
                            has_rules ? (const int64_t *)v[7].buf : NULL, mark, "pack_vector");
    if (status >= 0)
        result = PyBool_FromLong(status);

done:
    free(mark);
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(cpu, mem, cpu_heavy, mem_heavy, host_cpu, host_mem, eps, out) -> bool\n\n"
     "Fill hosts in order from the two sorted task lists (MCB, paper section 3.4); see vcsched/solvers/mcb.py."},
    {"pack_vector", pack_vector, METH_VARARGS,
     "pack_vector(need, d, order, list_ptr, capacity, eps, out[, group, host_ptr, host_groups]) -> bool\n\n"
     "The same packing on d-dimensional resource vectors; see vcsched/solvers/mcb_vector.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mcbc", "C kernel of the MCB packing (vcsched.solvers.mcb).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__mcbc(void) { return PyModule_Create(&module); }
