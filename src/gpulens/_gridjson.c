/* Range-answer arrays on a step grid, read and written without a Python object per sample.
 *
 * scan(array, step_ms): a Prometheus `values` array, `[[t,"v"],[t,"v"],...]` exactly as Prometheus
 * and VictoriaMetrics write it (no whitespace; t a JSON number of whole seconds with at most three
 * decimals; v a finite JSON number, or NaN, +Inf, -Inf), whose times lie on one grid of step_ms,
 * ascending. Returns (first_ms, offsets, blob, n, bad): offsets None when the n samples are gap-free
 * (the k-th at first_ms + k * step_ms), else a list of each one's grid index from first_ms; blob the
 * n value texts joined by commas; bad the indices of the NaN/Inf ones. None for anything else (the
 * caller's Python path then says what it is): nothing of the input is trusted.
 *
 * items(first_ms, step_ms, blob, n, offsets, lo_ms, hi_ms): the Lyceum items
 * `{"timestamp":"YYYY-MM-DDTHH:MM:SS[.fff]Z","value":v}` comma-joined, of those samples inside
 * [lo_ms, hi_ms] whose text is finite, in order. None when a time falls outside years 1970-9999.
 *
 * See docs/architecture.md ("The compiled grid path").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TIME_MS 253402300799999LL /* 9999-12-31T23:59:59.999Z */

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* A time `digits[.d{1,3}]` at *pp, in ms; advances *pp. -1 when not that shape. */
static long long time_ms(const char **pp, const char *end) {
    const char *p = *pp;
    long long seconds = 0;
    int digits = 0;
    if (p >= end || !is_digit(*p)) return -1;
    if (*p == '0' && p + 1 < end && is_digit(p[1])) return -1; /* a leading zero: not JSON */
    while (p < end && is_digit(*p)) {
        if (++digits > 12) return -1;
        seconds = seconds * 10 + (*p++ - '0');
    }
    long long milli = 0;
    if (p < end && *p == '.') {
        p++;
        int decimals = 0;
        while (p < end && is_digit(*p)) {
            if (++decimals > 3) return -1;
            milli = milli * 10 + (*p++ - '0');
        }
        if (decimals == 0) return -1;
        for (; decimals < 3; decimals++) milli *= 10;
    }
    *pp = p;
    return seconds * 1000 + milli;
}

/* The value text at p up to its closing quote: its length when it is a finite JSON number
 * (*special 0) or NaN/+Inf/-Inf (*special 1), the quote at p[length]; else -1. */
static Py_ssize_t value_length(const char *p, const char *end, int *special) {
    const char *s = p;
    *special = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        const char *digits = p;
        while (p < end && is_digit(*p)) p++;
        if (p - digits > 40) return -1; /* could overflow a double: the Python path says what it is */
    } else {
        Py_ssize_t left = end - s;
        if ((left > 3 && memcmp(s, "NaN\"", 4) == 0)) {
            *special = 1;
            return 3;
        }
        if (left > 4 && (memcmp(s, "+Inf\"", 5) == 0 || memcmp(s, "-Inf\"", 5) == 0)) {
            *special = 1;
            return 4;
        }
        return -1;
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *digits = p;
        if (p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
        if (p - digits > 2) return -1; /* likewise: 1e-99 to 1e99 here, the rest in Python */
    }
    return p < end && *p == '"' ? p - s : -1;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long step_ms;
    if (!PyArg_ParseTuple(args, "y*L", &view, &step_ms)) return NULL;
    PyObject *result = NULL, *blob = NULL, *bad = NULL, *offsets = NULL;
    long long *times = NULL;
    const char *p = view.buf, *end = p + view.len;
    Py_ssize_t n = 0, capacity = view.len / 8 + 1; /* each sample takes at least `[0,"0"],` */
    if (step_ms <= 0 || view.len < 2 || *p++ != '[') goto none;
    times = PyMem_Malloc(sizeof(long long) * (size_t)capacity);
    blob = PyBytes_FromStringAndSize(NULL, view.len);
    bad = PyList_New(0);
    if (times == NULL || blob == NULL || bad == NULL) {
        if (times == NULL) PyErr_NoMemory();
        goto done;
    }
    char *out = PyBytes_AS_STRING(blob), *out_start = out;
    int gap_free = 1;
    for (;;) {
        if (p >= end || *p++ != '[') goto none;
        long long ms = time_ms(&p, end);
        if (ms < 0 || end - p < 2 || p[0] != ',' || p[1] != '"') goto none;
        p += 2;
        int special;
        Py_ssize_t len = value_length(p, end, &special);
        if (len < 0 || end - p < len + 3 || p[len + 1] != ']' || n == capacity) goto none;
        if (n) {
            long long d = ms - times[0];
            if (ms <= times[n - 1] || d % step_ms) goto none;
            if (d != n * step_ms) gap_free = 0;
            *out++ = ',';
        }
        times[n] = ms;
        memcpy(out, p, (size_t)len);
        out += len;
        if (special) {
            PyObject *index = PyLong_FromSsize_t(n);
            if (index == NULL || PyList_Append(bad, index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
        n++;
        p += len + 2;
        if (*p == ']' && p + 1 == end) break;
        if (*p++ != ',') goto none;
    }
    if (_PyBytes_Resize(&blob, out - out_start) < 0) goto done;
    if (gap_free) {
        offsets = Py_NewRef(Py_None);
    } else {
        offsets = PyList_New(n);
        if (offsets == NULL) goto done;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *index = PyLong_FromLongLong((times[k] - times[0]) / step_ms);
            if (index == NULL) goto done;
            PyList_SET_ITEM(offsets, k, index);
        }
    }
    result = Py_BuildValue("(LOOnO)", times[0], offsets, blob, n, bad);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(blob);
    Py_XDECREF(bad);
    PyMem_Free(times);
    PyBuffer_Release(&view);
    return result;
}

/* days since 1970-01-01 to the civil date (proleptic Gregorian; H. Hinnant's algorithm) */
static void civil(long long days, int *y, int *m, int *d) {
    days += 719468;
    long long era = days / 146097;
    long long doe = days - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}

static inline char *two(char *o, int v) {
    o[0] = (char)('0' + v / 10);
    o[1] = (char)('0' + v % 10);
    return o + 2;
}

static PyObject *items(PyObject *self, PyObject *args) {
    (void)self;
    long long first_ms, step_ms, lo_ms, hi_ms;
    Py_buffer view;
    Py_ssize_t n;
    PyObject *offsets;
    if (!PyArg_ParseTuple(args, "LLy*nOLL", &first_ms, &step_ms, &view, &n, &offsets, &lo_ms, &hi_ms))
        return NULL;
    PyObject *out = NULL;
    if (step_ms <= 0 || n < 0 || (offsets != Py_None && (!PyList_Check(offsets) || PyList_GET_SIZE(offsets) != n))) {
        PyErr_SetString(PyExc_ValueError, "items: step, count or offsets do not fit");
        goto done;
    }
    /* each item: `{"timestamp":"` 14, the time at most 24, `","value":` 10, the text, `}` and `,` */
    Py_ssize_t bound = view.len + n * 50 + 1;
    out = PyBytes_FromStringAndSize(NULL, bound);
    if (out == NULL) goto done;
    char *o = PyBytes_AS_STRING(out), *start = o;
    const char *v = view.buf, *end = v + view.len;
    long long day = -1;
    char date[10];
    for (Py_ssize_t k = 0; k < n; k++) {
        const char *comma = memchr(v, ',', (size_t)(end - v));
        const char *stop = comma ? comma : end;
        Py_ssize_t len = stop - v;
        if (len <= 0 || (k + 1 < n) != (comma != NULL)) {
            PyErr_SetString(PyExc_ValueError, "items: the blob does not hold n texts");
            Py_CLEAR(out);
            goto done;
        }
        long long index = k;
        if (offsets != Py_None) {
            index = PyLong_AsLongLong(PyList_GET_ITEM(offsets, k));
            if (index == -1 && PyErr_Occurred()) {
                Py_CLEAR(out);
                goto done;
            }
        }
        long long ms;
        if (__builtin_mul_overflow(index, step_ms, &ms) || __builtin_add_overflow(ms, first_ms, &ms)) {
            PyErr_SetString(PyExc_ValueError, "items: a time out of range");
            Py_CLEAR(out);
            goto done;
        }
        if (ms >= lo_ms && ms <= hi_ms && v[0] != 'N' && v[len - 1] != 'f') {
            if (ms < 0 || ms > MAX_TIME_MS) {
                Py_CLEAR(out);
                out = Py_NewRef(Py_None);
                goto done;
            }
            long long seconds = ms / 1000, of_day = seconds % 86400;
            if (seconds / 86400 != day) {
                int y, m, d;
                day = seconds / 86400;
                civil(day, &y, &m, &d);
                date[0] = (char)('0' + y / 1000);
                date[1] = (char)('0' + y / 100 % 10);
                two(date + 2, y % 100);
                date[4] = '-';
                two(date + 5, m);
                date[7] = '-';
                two(date + 8, d);
            }
            if (o != start) *o++ = ',';
            memcpy(o, "{\"timestamp\":\"", 14);
            o += 14;
            memcpy(o, date, 10);
            o += 10;
            *o++ = 'T';
            o = two(o, (int)(of_day / 3600));
            *o++ = ':';
            o = two(o, (int)(of_day / 60 % 60));
            *o++ = ':';
            o = two(o, (int)(of_day % 60));
            int milli = (int)(ms % 1000);
            if (milli) {
                *o++ = '.';
                *o++ = (char)('0' + milli / 100);
                o = two(o, milli % 100);
            }
            memcpy(o, "Z\",\"value\":", 11);
            o += 11;
            memcpy(o, v, (size_t)len);
            o += len;
            *o++ = '}';
        }
        v = stop + 1;
    }
    _PyBytes_Resize(&out, o - start);
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "A values array on a step grid: (first_ms, offsets, blob, n, bad) or None."},
    {"items", items, METH_VARARGS, "The Lyceum items of packed grid samples inside [lo_ms, hi_ms]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_gridjson", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__gridjson(void) { return PyModule_Create(&module); }
