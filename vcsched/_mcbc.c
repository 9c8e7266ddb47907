/*
 * The MCB packing kernel in C (paper section 3.4); the reference is
 * vcsched.mcb.pack_python and the two must make exactly the same decisions.
 *
 * pack(cpu, mem, cpu_heavy, mem_heavy, host_cpu, host_mem, eps, out) -> bool
 *
 *   cpu, mem            float64 per task: c = Y * alpha and m for this probe
 *   cpu_heavy,
 *   mem_heavy           int64 task indices, each list already sorted in scan order
 *   host_cpu, host_mem  float64 capacities per host, filled in index order
 *   eps                 fit tolerance: a task fits when c <= free_c + eps and m <= free_m + eps
 *   out                 writable int64 per task: the host of each task (-1 when left over)
 *
 * Returns True when every task is placed.  Arrays are taken through the
 * buffer protocol (no numpy headers); the Python wrapper guarantees dtypes,
 * this file checks sizes and index ranges.
 *
 * Why it is fast: placed tasks are unlinked from their list (singly linked
 * over list positions), and each host keeps one cursor per list.  The
 * reference scans a list from its start on every search; a task skipped on
 * this host because it did not fit can never fit later on the same host
 * (free capacity only shrinks), so resuming at the cursor finds the same
 * first fitting task.  Each host therefore walks each list at most once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const int64_t *task;  /* task index at each list position */
    Py_ssize_t *next;     /* next live position, -1 at the end */
    double *tail_c;       /* tail_c[p]: smallest CPU need at positions >= p (placed tasks included) */
    double *tail_m;       /* the same for memory */
    Py_ssize_t head;      /* first live position, -1 when empty */
    Py_ssize_t prev, cur; /* this host's cursor: positions before cur did not fit */
} List;

static int list_init(List *l, const int64_t *task, Py_ssize_t n, const double *cpu, const double *mem)
{
    size_t size = (size_t)(n > 0 ? n : 1);
    l->task = task;
    l->next = (Py_ssize_t *)malloc(sizeof(Py_ssize_t) * size);
    l->tail_c = (double *)malloc(sizeof(double) * size);
    l->tail_m = (double *)malloc(sizeof(double) * size);
    if (l->next == NULL || l->tail_c == NULL || l->tail_m == NULL)
        return -1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        double c = cpu[task[i]], m = mem[task[i]];
        l->next[i] = (i + 1 < n) ? i + 1 : -1;
        l->tail_c[i] = (i + 1 < n && l->tail_c[i + 1] < c) ? l->tail_c[i + 1] : c;
        l->tail_m[i] = (i + 1 < n && l->tail_m[i + 1] < m) ? l->tail_m[i + 1] : m;
    }
    l->head = n > 0 ? 0 : -1;
    return 0;
}

/* Advance l's cursor to the first live task that fits; returns its task index or -1. */
static int64_t list_find(List *l, const double *cpu, const double *mem, double limit_c, double limit_m)
{
    while (l->cur != -1) {
        if (l->tail_c[l->cur] > limit_c || l->tail_m[l->cur] > limit_m) {
            /* Nothing from here on fits this host (the bound covers every live task after cur). */
            l->prev = -1; /* never used: cur == -1 means the list is exhausted for this host */
            l->cur = -1;
            return -1;
        }
        int64_t t = l->task[l->cur];
        if (cpu[t] <= limit_c && mem[t] <= limit_m)
            return t;
        l->prev = l->cur;
        l->cur = l->next[l->cur];
    }
    return -1;
}

/* Unlink the task at the cursor; the cursor moves to its successor. */
static void list_take(List *l)
{
    Py_ssize_t nxt = l->next[l->cur];
    if (l->prev == -1)
        l->head = nxt;
    else
        l->next[l->prev] = nxt;
    l->cur = nxt;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *name,
                      Py_ssize_t *count)
{
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes is not a whole number of %zd-byte items", name,
                     view->len, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *count = view->len / itemsize;
    return 0;
}

static PyObject *pack(PyObject *self, PyObject *args)
{
    PyObject *o[6], *o_out;
    double eps;
    if (!PyArg_ParseTuple(args, "OOOOOOdO:pack", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &eps, &o_out))
        return NULL;
    static const char *names[6] = {"cpu", "mem", "cpu_heavy", "mem_heavy", "host_cpu", "host_mem"};
    static const Py_ssize_t sizes[6] = {8, 8, 8, 8, 8, 8};
    Py_buffer v[7];
    Py_ssize_t n[7];
    int got = 0;
    PyObject *result = NULL;
    List lists[2] = {{0}, {0}};

    for (; got < 6; got++)
        if (get_buffer(o[got], &v[got], 0, sizes[got], names[got], &n[got]) < 0)
            goto done;
    if (get_buffer(o_out, &v[6], 1, 8, "out", &n[6]) < 0)
        goto done;
    got = 7;

    Py_ssize_t n_tasks = n[0], n_hosts = n[4];
    if (n[1] != n_tasks || n[6] != n_tasks || n[2] + n[3] != n_tasks || n[5] != n_hosts) {
        PyErr_SetString(PyExc_ValueError, "pack: inconsistent array lengths");
        goto done;
    }
    const double *cpu = (const double *)v[0].buf, *mem = (const double *)v[1].buf;
    const double *hcpu = (const double *)v[4].buf, *hmem = (const double *)v[5].buf;
    int64_t *out = (int64_t *)v[6].buf;
    for (Py_ssize_t t = 0; t < n_tasks; t++)
        out[t] = -1;
    for (int li = 0; li < 2; li++) {
        const int64_t *idx = (const int64_t *)v[2 + li].buf;
        for (Py_ssize_t i = 0; i < n[2 + li]; i++) {
            if (idx[i] < 0 || idx[i] >= n_tasks || out[idx[i]] != -1) {
                PyErr_Format(PyExc_ValueError, "pack: %s[%zd] = %lld is out of range or repeated", names[2 + li],
                             i, (long long)idx[i]);
                goto done;
            }
            out[idx[i]] = -2; /* mark seen: the two lists must partition the tasks */
        }
    }
    for (Py_ssize_t t = 0; t < n_tasks; t++)
        out[t] = -1;
    if (list_init(&lists[0], (const int64_t *)v[2].buf, n[2], cpu, mem) < 0 ||
        list_init(&lists[1], (const int64_t *)v[3].buf, n[3], cpu, mem) < 0) {
        PyErr_NoMemory();
        goto done;
    }

    Py_ssize_t left = n_tasks;
    for (Py_ssize_t h = 0; h < n_hosts && left > 0; h++) {
        double free_c = hcpu[h], free_m = hmem[h];
        for (int li = 0; li < 2; li++) {
            lists[li].prev = -1;
            lists[li].cur = lists[li].head;
        }
        int first = 1;
        while (left > 0) {
            /* First task: CPU-heavy list, then memory-heavy.  Then against the imbalance. */
            int a = (first || free_c > free_m) ? 0 : 1;
            int li = a;
            int64_t t = list_find(&lists[a], cpu, mem, free_c + eps, free_m + eps);
            if (t < 0) {
                li = 1 - a;
                t = list_find(&lists[li], cpu, mem, free_c + eps, free_m + eps);
            }
            if (t < 0)
                break; /* nothing fits: next host */
            list_take(&lists[li]);
            out[t] = (int64_t)h;
            free_c -= cpu[t];
            free_m -= mem[t];
            left--;
            first = 0;
        }
    }
    result = PyBool_FromLong(left == 0);

done:
    for (int li = 0; li < 2; li++) {
        free(lists[li].next);
        free(lists[li].tail_c);
        free(lists[li].tail_m);
    }
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(cpu, mem, cpu_heavy, mem_heavy, host_cpu, host_mem, eps, out) -> bool\n\n"
     "Fill hosts in order from the two sorted task lists (MCB, paper section 3.4); see vcsched/mcb.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mcbc",
                                    "C kernel of the MCB packing (vcsched.mcb).", -1, methods};

PyMODINIT_FUNC PyInit__mcbc(void) { return PyModule_Create(&module); }
