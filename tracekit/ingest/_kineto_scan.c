/*
 * _kineto_scan: the Kineto parser's optional native fast path.
 *
 * What it does. tracekit/ingest/kineto_stream.py cuts a trace's "traceEvents" array into runs
 * of whole elements; each run is decoded by msgspec into RawEvent structs, and
 * kineto_rows._RowBuilder._add_columns turns those into typed columns (source index, category
 * code, name code, start and duration in ns, pid, tid, sequence number, correlation id).
 * Scanner.scan reads the same bytes once and writes those columns directly: no struct, no
 * Python object per event. kineto_native.py is the Python side (loading, TRACEKIT_NATIVE=0,
 * wrapping the columns as arrays) and _RowBuilder._add_scanned applies the answer.
 *
 * The contract: identical rows or no answer. For a run of elements, scan() either returns
 * exactly what the msgspec decode plus _add_columns would add for those elements, or it
 * returns None ("declines") having changed nothing, and the Python path reads those bytes as
 * it always has. Declining is always safe; a wrong answer never is. So the grammar accepted
 * is a strict subset of what msgspec decodes, and any value whose meaning in the Python path
 * depends on more than the value itself (numpy's batch-wide type promotion, msgspec's
 * generic fallback) is declined.
 *
 * The grammar accepted. A run is  ws? element (ws? "," ws? element)*  where an element is
 * a JSON object (RFC 8259, whitespace only space, tab, CR, LF):
 *   - strings: valid UTF-8 (no overlong forms, no encoded surrogates, at most U+10FFFF), no
 *     raw control characters, escapes \" \\ \/ \b \f \n \r \t \uXXXX, a \u high surrogate
 *     only when a \u low surrogate follows (msgspec refuses lone ones);
 *   - numbers: the JSON grammar, at most 64 characters, decimal magnitude within 1e+-300
 *     (msgspec refuses floats that overflow in the fields it decodes); floats are read
 *     correctly rounded, as msgspec reads them (an exact product or quotient of two exact
 *     doubles where that gives the answer, else PyOS_string_to_double);
 *   - containers nested at most MAX_DEPTH (32) deep (deeper, msgspec may run out of
 *     recursion and the run goes the generic way in Python);
 *   - keys of an element and of its "args" without escapes, and no key read twice (msgspec
 *     would match "p\u0068" to "ph", and keeps the last of repeated keys).
 * Per element (what RawEvent/RawArgs decode and _add_columns reads):
 *   - "ph" a one-character string of a Chrome-trace phase (kineto_stream.KNOWN_PHASES);
 *     elements of phases other than "X" are counted and otherwise skipped ("B" and "E"
 *     duration events counted apart: tracekit does not pair them, and says so);
 *   - for "X": "cat" absent or a string; "args" absent, null or an object; a "ts" that is a
 *     bool or an integer of 19+ digits is declined (the time base probe would read it); of
 *     an "X" not kept, nothing else is read;
 *   - of a "python_function" "X" (torch.profiler's with_stack: a frame per Python call), its
 *     "name": the frame is kept where _RowBuilder.keeps_frame says its name is an action
 *     frame's (asked once per distinct name, and only of names that end with one of the
 *     endings every action frame's name has, or hold an escape); a name absent is the empty
 *     text, a name that is no text names no such frame (both as keeps_frame reads them);
 *   - for a kept "X" (its category is one _RowBuilder keeps): "name" absent or a string;
 *     "ts" a number, "dur" absent or a number, both below 2**52 us in magnitude, where an
 *     integer is exact times 1000 and a float is rint(x * 1000.0) in double, as numpy
 *     computes it; "pid"/"tid" absent or integers of at most 18 digits; "Sequence number",
 *     "External id"/"correlation" of args integers of at most 18 digits (kept), or a float,
 *     string or null (-1), never a bool, a longer integer, a list or an object.
 *   - per run: a ts or dur column mixing integers and floats with a value of 2**53/1000 us
 *     or more is declined (numpy would round the integers; the Python path then goes event
 *     by event).
 * Where the run ends. In "cut" mode the run ends at the last element followed by "," and
 * the "{" of the next one within the buffer: the seam ChromeTraceStream._cut finds by trial
 * decoding (the Python side checks it is one of the candidates _cut would try). Elements
 * after it are left for the next buffer. In "last" mode the run ends at the array's "]"
 * after the last element (ChromeTraceStream._finish; the Python side checks that _finish
 * would try that "]" as the end of the array).
 * What the Python side still does. Names and categories are resolved against the builder's
 * dicts, but the dicts are only read here: names met for the first time get the codes
 * _add_columns gives them (the next ones, in the order they come) and are returned, in that
 * order, for the Python side to record; categories met
 * are returned for the builder's record of them. For the P2P and collective ops whose args
 * _special_args reads, the scanner builds what it returns where that is plain (text, ints,
 * absent fields, raw JSON slices as msgspec.Raw keeps them); otherwise it returns the
 * element's byte range and msgspec decodes that one element for _special_args.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_NUMBER_CHARS 64
/* |ts|, |dur| in us below this: times 1000 fits int64, and ints convert to double exactly. */
#define TIME_LIMIT_US 4503599627370496.0 /* 2**52 */
/* kineto_rows._EXACT_FLOAT_US: below it, float math on integer us is exact. */
#define EXACT_FLOAT_US (9007199254740992.0 / 1000.0)
#define PHASES "XBEiICbnestfPNODMVvRc()"

#if defined(__SSE2__)
#include <emmintrin.h> /* x86-64 always has SSE2: 16 string bytes checked at once */
#endif

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define FAST_FLOATS 1 /* double arithmetic is IEEE double, rounded once per operation */
#else
#define FAST_FLOATS 0
#endif

typedef enum { ST_OK = 0, ST_MORE, ST_DECLINE, ST_ERROR } Status;

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    const char *why; /* why the scanner declined (static text) */
} Cursor;

#define DECLINE(c, reason)   \
    do {                     \
        (c)->why = (reason); \
        return ST_DECLINE;   \
    } while (0)

typedef enum { V_ABSENT = 0, V_INT, V_BIGINT, V_FLOAT, V_STRING, V_TRUE, V_FALSE, V_NULL, V_ARRAY, V_OBJECT } Kind;

typedef struct {
    Kind kind;
    int64_t i;              /* V_INT */
    double f;               /* V_FLOAT */
    const unsigned char *s; /* V_STRING: the raw bytes between the quotes */
    Py_ssize_t n;
    int escaped; /* V_STRING: holds a backslash escape */
} Value;

/* -- JSON tokens ------------------------------------------------------------------------ */

static const unsigned char IS_WS[256] = {[' '] = 1, ['\n'] = 1, ['\r'] = 1, ['\t'] = 1};

static inline void skip_ws(Cursor *c) {
    const unsigned char *p = c->p, *end = c->end;
    while (p < end && IS_WS[*p])
        p++;
    c->p = p;
}

/* Whether a string byte is one scan_string must look at: '"', '\\', below 0x20 or above 0x7f. */
static inline int needs_care(unsigned char b) {
    return b == '"' || b == '\\' || b < 0x20 || b >= 0x80;
}

/* The first byte from p that needs care, or end. */
static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* signed compare: bytes 0x80-0xff are negative, so below 0x20 too */
        __m128i care = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)),
                                    _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(care);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && !needs_care(*p))
        p++;
    return p;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned u = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char b = p[k];
        unsigned d;
        if (b >= '0' && b <= '9')
            d = b - '0';
        else if (b >= 'a' && b <= 'f')
            d = b - 'a' + 10;
        else if (b >= 'A' && b <= 'F')
            d = b - 'A' + 10;
        else
            return -1;
        u = u * 16 + d;
    }
    *out = u;
    return 0;
}

/* A backslash escape at *pp; the bytes running out inside it is ST_MORE. */
static Status scan_escape(Cursor *c, const unsigned char **pp) {
    const unsigned char *p = *pp;
    ptrdiff_t left = c->end - p;
    unsigned u, low;
    if (left < 2)
        return ST_MORE;
    switch (p[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        *pp = p + 2;
        return ST_OK;
    case 'u':
        if (left < 6)
            return ST_MORE;
        if (hex4(p + 2, &u) < 0)
            DECLINE(c, "a bad \\u escape");
        if (u >= 0xDC00 && u <= 0xDFFF)
            DECLINE(c, "a lone low surrogate escape");
        if (u < 0xD800 || u > 0xDBFF) {
            *pp = p + 6;
            return ST_OK;
        }
        if (left < 12)
            return ST_MORE;
        if (p[6] != '\\' || p[7] != 'u' || hex4(p + 8, &low) < 0 || low < 0xDC00 || low > 0xDFFF)
            DECLINE(c, "a lone high surrogate escape");
        *pp = p + 12;
        return ST_OK;
    default:
        DECLINE(c, "a bad escape");
    }
}

/* One UTF-8 encoded character (not ASCII) at *pp, strictly (RFC 3629). */
static Status scan_utf8(Cursor *c, const unsigned char **pp) {
    const unsigned char *p = *pp;
    ptrdiff_t left = c->end - p;
    unsigned char b = p[0], lo = 0x80, hi = 0xBF;
    int n;
    if (b >= 0xC2 && b <= 0xDF)
        n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0)
            lo = 0xA0; /* overlong */
        else if (b == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0)
            lo = 0x90; /* overlong */
        else if (b == 0xF4)
            hi = 0x8F; /* beyond U+10FFFF */
    } else
        DECLINE(c, "invalid UTF-8");
    for (int k = 1; k < n; k++) {
        if (k >= left)
            return ST_MORE;
        if (p[k] < (k == 1 ? lo : 0x80) || p[k] > (k == 1 ? hi : 0xBF))
            DECLINE(c, "invalid UTF-8");
    }
    *pp = p + n;
    return ST_OK;
}

/* A string at c->p (its opening quote). */
static Status scan_string(Cursor *c, Value *v) {
    const unsigned char *p = c->p + 1, *end = c->end, *start = p;
    int escaped = 0;
    Status st;
    for (;;) {
        p = plain_run(p, end);
        if (p >= end)
            return ST_MORE;
        unsigned char b = *p;
        if (b == '"')
            break;
        if (b == '\\') {
            escaped = 1;
            if ((st = scan_escape(c, &p)) != ST_OK)
                return st;
        } else if (b < 0x20)
            DECLINE(c, "a control character in a string");
        else if ((st = scan_utf8(c, &p)) != ST_OK)
            return st;
    }
    v->kind = V_STRING;
    v->s = start;
    v->n = p - start;
    v->escaped = escaped;
    c->p = p + 1;
    return ST_OK;
}

/* The digits leading the 8 bytes at p (0 to 8 of them) and their value, without a branch per
   digit (the SWAR method, little-endian): a Kineto timestamp's 13-16 integer digits take two
   steps, a duration's or an id's few digits one, instead of a loop whose exit the branch
   predictor keeps missing. Where the byte order is not little-endian: 0 (the byte loop reads
   them). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR_DIGITS 1
#else
#define SWAR_DIGITS 0
#endif
static const uint64_t POW10_INT[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};

static inline int leading_digits(const unsigned char *p, uint64_t *value) {
#if SWAR_DIGITS
    const uint64_t ZEROS = 0x3030303030303030u, HIGH = 0xF0F0F0F0F0F0F0F0u;
    uint64_t w;
    memcpy(&w, p, 8);
    /* A byte is a digit where its high nibble is 3 both as it is and with 6 added (0x3A-0x3F
       carry into 4). A carry out of a byte (>= 0xFA, no digit) only reaches later bytes. */
    uint64_t other = ((w & HIGH) ^ ZEROS) | (((w + 0x0606060606060606u) & HIGH) ^ ZEROS);
    int n = other ? __builtin_ctzll(other) >> 3 : 8;
    if (n == 0)
        return 0;
    if (n < 8) /* the n digits moved to the top, '0's below them */
        w = (w << (8 * (8 - n))) | (ZEROS >> (8 * n));
    w -= ZEROS;
    w = w * 10 + (w >> 8); /* pairs of digits */
    w = (((w & 0x000000FF000000FFu) * (100 + (1000000ull << 32))) +
         (((w >> 16) & 0x000000FF000000FFu) * (1 + (10000ull << 32)))) >> 32;
    *value = w;
    return n;
#else
    (void)p;
    (void)value;
    return 0;
#endif
}

/* The significant digits at p, up to eight at a step while the mantissa has room for them
   (19 digits): added to *mant, counted in *sig and *count; where they end. The digits left
   (near the bytes' end, or past the 19th) are the caller's byte loop's. */
static inline const unsigned char *significant_digits(const unsigned char *p, const unsigned char *end,
                                                      uint64_t *mant, int *sig, int *count) {
    uint64_t value;
    int n = 8;
    while (n == 8 && *sig <= 19 - 8 && end - p >= 8 && (n = leading_digits(p, &value)) > 0) {
        *mant = *mant * POW10_INT[n] + value;
        *sig += n;
        *count += n;
        p += n;
    }
    return p;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number at c->p: V_INT (with its value), V_BIGINT or V_FLOAT (its value only with
   want_value). A number touching the end of the bytes may go on: ST_MORE. */
static Status scan_number(Cursor *c, Value *v, int want_value) {
    const unsigned char *p = c->p, *end = c->end, *start = p;
    int neg = 0, is_float = 0, int_digits = 0, frac_digits = 0, lead_zeros = 0, sig_digits = 0;
    uint64_t mant = 0;
    long exp = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end)
        return ST_MORE;
    if (*p == '0') {
        p++;
        int_digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        p = significant_digits(p, end, &mant, &sig_digits, &int_digits);
        while (p < end && *p >= '0' && *p <= '9') {
            if (sig_digits < 19)
                mant = mant * 10 + (*p - '0');
            sig_digits++;
            int_digits++;
            p++;
        }
    } else
        DECLINE(c, "a bad number");
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end)
            return ST_MORE;
        if (!(*p >= '0' && *p <= '9'))
            DECLINE(c, "a bad number");
        if (sig_digits > 0) /* after a significant digit every digit is one */
            p = significant_digits(p, end, &mant, &sig_digits, &frac_digits);
        while (p < end && *p >= '0' && *p <= '9') {
            if (sig_digits == 0 && *p == '0')
                lead_zeros++; /* 0.000123: not significant */
            else {
                if (sig_digits < 19)
                    mant = mant * 10 + (*p - '0');
                sig_digits++;
            }
            frac_digits++;
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exp_neg = 0;
        is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            exp_neg = *p++ == '-';
        if (p >= end)
            return ST_MORE;
        if (!(*p >= '0' && *p <= '9'))
            DECLINE(c, "a bad number");
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp < 100000)
                exp = exp * 10 + (*p - '0');
            p++;
        }
        if (exp_neg)
            exp = -exp;
    }
    if (p >= end)
        return ST_MORE;
    if (p - start > MAX_NUMBER_CHARS)
        DECLINE(c, "a number of more than 64 characters");
    c->p = p;
    if (is_float) {
        /* The decimal exponent of the leading digit, roughly: far from what a double holds. */
        long magnitude = sig_digits == 0 ? 0 : start[neg] != '0' ? int_digits + exp : exp - lead_zeros;
        if (magnitude > 300 || magnitude < -300)
            DECLINE(c, "a float beyond 1e300");
    }
    if (!is_float) {
        if (int_digits > 18) {
            v->kind = V_BIGINT;
            return ST_OK;
        }
        v->kind = V_INT;
        v->i = neg ? -(int64_t)mant : (int64_t)mant;
        return ST_OK;
    }
    v->kind = V_FLOAT;
    if (!want_value)
        return ST_OK;
    long e10 = exp - frac_digits;
    if (FAST_FLOATS && sig_digits <= 19 && mant <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* Both operands exact: one correctly rounded operation (Clinger's fast path). */
        double d = (double)mant;
        d = e10 >= 0 ? d * POW10[e10] : d / POW10[-e10];
        v->f = neg ? -d : d;
        return ST_OK;
    }
    char text[MAX_NUMBER_CHARS + 1];
    char *stop;
    Py_ssize_t len = p - start;
    memcpy(text, start, len);
    text[len] = '\0';
    double d = PyOS_string_to_double(text, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred())
        return ST_ERROR;
    if (stop != text + len || !isfinite(d))
        DECLINE(c, "a float strtod reads otherwise");
    v->f = d;
    return ST_OK;
}

static Status scan_literal(Cursor *c, const char *word, Py_ssize_t len, Kind kind, Value *v) {
    Py_ssize_t left = c->end - c->p;
    if (memcmp(c->p, word, left < len ? left : len) != 0)
        DECLINE(c, "not a JSON value");
    if (left < len)
        return ST_MORE;
    c->p += len;
    v->kind = kind;
    return ST_OK;
}

static Status scan_value(Cursor *c, Value *v, int depth, int want_value);

/* An object's key at c->p and the ':' after it, c->p left at its value (whitespace skipped).
   ``escaped_why``: the reason to decline a key with an escape (NULL: any key). */
static Status scan_key(Cursor *c, Value *key, const char *escaped_why) {
    Status st;
    if (*c->p != '"')
        DECLINE(c, "an object key that is not a string");
    if ((st = scan_string(c, key)) != ST_OK)
        return st;
    if (escaped_why != NULL && key->escaped)
        DECLINE(c, escaped_why);
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    if (*c->p != ':')
        DECLINE(c, "no ':' after a key");
    c->p++;
    skip_ws(c);
    return ST_OK;
}

/* After an item of a container: its ``close`` (consumed; *done = 1), or a ',' (consumed with
   the whitespace after it, c->p at the next item; *done = 0). */
static Status next_item(Cursor *c, unsigned char close, int *done) {
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    if (*c->p == close) {
        c->p++;
        *done = 1;
        return ST_OK;
    }
    if (*c->p != ',')
        DECLINE(c, "no ',' between items");
    c->p++;
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    *done = 0;
    return ST_OK;
}

/* An object or array at c->p, checked and skipped. */
static Status skip_container(Cursor *c, int depth) {
    unsigned char close = *c->p == '{' ? '}' : ']';
    Value item;
    Status st;
    if (depth > MAX_DEPTH)
        DECLINE(c, "nested too deep");
    c->p++;
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    if (*c->p == close) {
        c->p++;
        return ST_OK;
    }
    for (int done = 0; !done;) {
        if (close == '}' && (st = scan_key(c, &item, NULL)) != ST_OK)
            return st;
        if ((st = scan_value(c, &item, depth, 0)) != ST_OK || (st = next_item(c, close, &done)) != ST_OK)
            return st;
    }
    return ST_OK;
}

/* Any value at c->p (a container one level below depth): strings, numbers and literals
   classified, containers checked and skipped. */
static Status scan_value(Cursor *c, Value *v, int depth, int want_value) {
    if (c->p >= c->end)
        return ST_MORE;
    switch (*c->p) {
    case '"':
        return scan_string(c, v);
    case '{':
        v->kind = V_OBJECT;
        return skip_container(c, depth + 1);
    case '[':
        v->kind = V_ARRAY;
        return skip_container(c, depth + 1);
    case 't':
        return scan_literal(c, "true", 4, V_TRUE, v);
    case 'f':
        return scan_literal(c, "false", 5, V_FALSE, v);
    case 'n':
        return scan_literal(c, "null", 4, V_NULL, v);
    default:
        if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))
            return scan_number(c, v, want_value);
        DECLINE(c, "not a JSON value");
    }
}

/* -- elements --------------------------------------------------------------------------- */

/* The fields of args that RawArgs reads, in its order: the three ids _add_columns reads, the
   eight record_param_comms fields of _special_args (in its order), and three kept as raw JSON. */
enum { N_NCCL = 8, A_SEQ = 0, A_EXT, A_CORR, A_NCCL, A_RAW = A_NCCL + N_NCCL, N_ARGS = A_RAW + 3 };
static const char *const ARG_KEYS[N_ARGS] = {
    "Sequence number",   "External id",        "correlation",     "Collective name", "Dst Rank",
    "Src Rank",          "In msg nelems",      "Out msg nelems",  "dtype",           "Global rank start",
    "Global rank stride", "Concrete Inputs",   "Input Dims",      "Input type",
};

typedef struct {
    Value ph, cat, name, ts, dur, pid, tid;
    Kind args;           /* V_ABSENT, V_NULL, V_OBJECT or another kind */
    Value arg[N_ARGS];   /* of args; the raw ones hold the value's JSON text (s, n) */
} Element;

static inline int key_is(const Value *key, const char *name, Py_ssize_t len) {
    return key->n == len && memcmp(key->s, name, len) == 0;
}

/* An element's keys as the bytes that were read for them last time. A profiler writes every
   element alike, so the k-th key of an element is usually, byte for byte, the k-th key of the
   one before: the whitespace after the ',' (or the '{'), the quoted key, the ':' and the
   whitespace after it, e.g. "\n    \"cat\": ". Where the same bytes follow, they mean the same
   key and the same whitespace, checked as they were the first time: the key is taken from
   the memo, skipping the generic key scan (8-byte compares, no branch per byte). Any other
   bytes go the generic way, which records them for the next element. */
#define MEMO_KEYS 12
#define MEMO_WORDS 3 /* keys of up to 24 bytes, whitespace included */

enum { F_OTHER = 0, F_PH, F_CAT, F_NAME, F_TS, F_DUR, F_PID, F_TID, F_ARGS };

typedef struct {
    uint64_t word[MEMO_WORDS], mask[MEMO_WORDS];
    int len; /* 0: nothing recorded */
    int field;
} KeyMemo;

static inline int memo_matches(const KeyMemo *m, const unsigned char *p, const unsigned char *end) {
    uint64_t w[MEMO_WORDS], diff = 0;
    if (m->len == 0 || end - p < MEMO_WORDS * 8)
        return 0;
    memcpy(w, p, sizeof w);
    for (int k = 0; k < MEMO_WORDS; k++)
        diff |= (w[k] ^ m->word[k]) & m->mask[k];
    return diff == 0;
}

static void memo_record(KeyMemo *m, const unsigned char *from, const unsigned char *to, int field) {
    Py_ssize_t n = to - from;
    m->len = 0;
    if (n <= 0 || n > MEMO_WORDS * 8)
        return;
    unsigned char bytes[MEMO_WORDS * 8] = {0}, ones[MEMO_WORDS * 8] = {0};
    memcpy(bytes, from, n);
    memset(ones, 0xff, n);
    memcpy(m->word, bytes, sizeof m->word);
    memcpy(m->mask, ones, sizeof m->mask);
    m->len = (int)n;
    m->field = field;
}

#define KEY_CLOSED (-100) /* next_key: the object's '}' came where its first key would */

/* The next key of an object at c->p (after its '{' or a ','), through the memo ``m`` (NULL:
   none): *field is field_of(the key), or what ``m`` recorded for the same bytes, and c->p is
   left at its value. Before the first key (``first``) the object's '}' may come: consumed,
   *field = KEY_CLOSED. */
static inline Status next_key(Cursor *c, KeyMemo *m, int first, const char *escaped_why,
                              int (*field_of)(const Value *), int *field) {
    const unsigned char *from = c->p;
    Value key;
    Status st;
    if (m != NULL && memo_matches(m, from, c->end)) {
        c->p += m->len;
        *field = m->field;
        skip_ws(c); /* more whitespace than last time: what scan_key would skip too */
        return ST_OK;
    }
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    if (first && *c->p == '}') {
        c->p++;
        *field = KEY_CLOSED;
        return ST_OK;
    }
    if ((st = scan_key(c, &key, escaped_why)) != ST_OK)
        return st;
    *field = field_of(&key);
    if (m != NULL)
        memo_record(m, from, c->p, *field);
    return ST_OK;
}

/* After a value in an object: its '}' (consumed; *done = 1) or a ',' (consumed, not the
   whitespace after it: the next key's memo holds that; *done = 0). */
static inline Status after_value(Cursor *c, int *done) {
    skip_ws(c);
    if (c->p >= c->end)
        return ST_MORE;
    if (*c->p == '}') {
        c->p++;
        *done = 1;
        return ST_OK;
    }
    if (*c->p != ',')
        DECLINE(c, "no ',' between items");
    c->p++;
    *done = 0;
    return ST_OK;
}

/* The field of args a key is read into (-1: checked and skipped). */
static int args_field(const Value *key) {
    if (key->n >= 5 && key->n <= 18) /* the lengths of ARG_KEYS */
        for (int k = 0; k < N_ARGS; k++)
            if (key->s[0] == (unsigned char)ARG_KEYS[k][0] && key_is(key, ARG_KEYS[k], (Py_ssize_t)strlen(ARG_KEYS[k])))
                return k;
    return -1;
}

/* The object of "args" at c->p (depth 2); its keys through ``memo`` as an element's are. */
static Status scan_args(Cursor *c, Element *e, KeyMemo *memo) {
    Value skipped;
    Status st;
    c->p++;
    for (int index = 0, done = 0; !done; index++) {
        int field;
        if ((st = next_key(c, index < MEMO_KEYS ? &memo[index] : NULL, index == 0, "an args key with an escape",
                           args_field, &field)) != ST_OK)
            return st;
        if (field == KEY_CLOSED)
            return ST_OK; /* {} */
        if (field >= 0) {
            Value *slot = &e->arg[field];
            const unsigned char *value_start = c->p;
            if (slot->kind != V_ABSENT)
                DECLINE(c, "an args field given twice");
            if ((st = scan_value(c, slot, 2, 1)) != ST_OK)
                return st;
            if (field >= A_RAW) {
                slot->kind = V_OBJECT; /* present; its JSON text: */
                slot->s = value_start;
                slot->n = c->p - value_start;
            }
        } else if ((st = scan_value(c, &skipped, 2, 0)) != ST_OK)
            return st;
        if ((st = after_value(c, &done)) != ST_OK)
            return st;
    }
    return ST_OK;
}

/* The field a key of an element is read into (F_OTHER: checked and skipped). */
static int element_field(const Value *key) {
    switch (key->n) {
    case 2:
        return key_is(key, "ph", 2) ? F_PH : key_is(key, "ts", 2) ? F_TS : F_OTHER;
    case 3:
        return key_is(key, "cat", 3)   ? F_CAT
               : key_is(key, "dur", 3) ? F_DUR
               : key_is(key, "pid", 3) ? F_PID
               : key_is(key, "tid", 3) ? F_TID
                                       : F_OTHER;
    case 4:
        return key_is(key, "name", 4) ? F_NAME : key_is(key, "args", 4) ? F_ARGS : F_OTHER;
    }
    return F_OTHER;
}

/* Which of an element's memos its next keys use, once its phase is read: a profiler writes
   complete events, instant events and flow starts and ends each with their own keys. */
#define MEMO_SETS 5
static inline int memo_set(const Value *ph) {
    if (ph->kind != V_STRING || ph->n != 1)
        return 0;
    switch (ph->s[0]) {
    case 'X':
        return 1;
    case 'i':
    case 'I':
        return 2;
    case 's':
        return 3;
    case 'f':
        return 4;
    }
    return 0;
}

/* Which memo an element's args use: each category of op has its own args (a kernel's launch
   figures, a CPU op's ids), told apart here by the category's text where it came first. */
#define ARGS_SETS 8
static inline int args_set(const Value *cat) {
    if (cat->kind != V_STRING || cat->n == 0)
        return 0;
    return (int)(((size_t)cat->n * 31 + cat->s[0] + cat->s[cat->n - 1]) % ARGS_SETS);
}

/* One element at c->p (its '{'): the fields RawEvent reads, the rest checked and skipped. */
static Status scan_element(Cursor *c, Element *e, KeyMemo (*memos)[MEMO_KEYS], KeyMemo (*args_memos)[MEMO_KEYS]) {
    KeyMemo *memo = memos[0]; /* until the phase is read */
    Value skipped;
    Status st;
    e->ph.kind = e->cat.kind = e->name.kind = e->ts.kind = e->dur.kind = e->pid.kind = e->tid.kind = V_ABSENT;
    e->args = V_ABSENT;
    for (int k = 0; k < N_ARGS; k++)
        e->arg[k].kind = V_ABSENT;
    c->p++;
    for (int index = 0, done = 0; !done; index++) {
        int field;
        if ((st = next_key(c, index < MEMO_KEYS ? &memo[index] : NULL, index == 0, "an element key with an escape",
                           element_field, &field)) != ST_OK)
            return st;
        if (field == KEY_CLOSED)
            DECLINE(c, "an element without 'ph'");
        if (c->p >= c->end)
            return ST_MORE;
        if (field == F_ARGS) {
            if (e->args != V_ABSENT)
                DECLINE(c, "a field given twice");
            if (*c->p == '{') {
                e->args = V_OBJECT;
                st = scan_args(c, e, args_memos[args_set(&e->cat)]);
            } else {
                st = scan_value(c, &skipped, 1, 0);
                e->args = skipped.kind;
            }
        } else if (field == F_OTHER)
            st = scan_value(c, &skipped, 1, 0);
        else {
            Value *slot = field == F_PH    ? &e->ph
                          : field == F_CAT  ? &e->cat
                          : field == F_NAME ? &e->name
                          : field == F_TS   ? &e->ts
                          : field == F_DUR  ? &e->dur
                          : field == F_PID  ? &e->pid
                                            : &e->tid;
            if (slot->kind != V_ABSENT)
                DECLINE(c, "a field given twice");
            st = scan_value(c, slot, 1, 1);
            if (field == F_PH)
                memo = memos[memo_set(slot)];
        }
        if (st != ST_OK || (st = after_value(c, &done)) != ST_OK)
            return st;
    }
    return ST_OK;
}

/* -- text met: names and categories by their raw JSON bytes -------------------------------- */

enum { SPECIAL_P2P = 1, SPECIAL_NCCL = 2 };

typedef struct {
    char *raw; /* the string's bytes between the quotes (owned); NULL: an empty slot */
    Py_ssize_t n;
    uint64_t hash;
    PyObject *text; /* the decoded string */
    long code;      /* name code (-1: not in name_codes when last looked) or category code */
    int special;    /* SPECIAL_P2P or SPECIAL_NCCL: an op whose args _special_args reads */
    uint64_t run;   /* the run that last counted it */
    uint64_t new_run; /* a name not in name_codes: the run that gave it new_code */
    long new_code;
    int frame;        /* of a python_function's name: FRAME_UNASKED, FRAME_KEPT or FRAME_DROPPED */
} Entry;

enum { FRAME_UNASKED = 0, FRAME_KEPT, FRAME_DROPPED };

typedef struct {
    Entry *slots;
    size_t cap; /* a power of two */
    size_t used;
} Table;

static uint64_t hash_bytes(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, w;
    while (n >= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static Entry *table_find(Table *t, const unsigned char *s, Py_ssize_t n, uint64_t h) {
    size_t mask = t->cap - 1, i = h & mask;
    for (;;) {
        Entry *e = &t->slots[i];
        if (e->raw == NULL)
            return e;
        if (e->hash == h && e->n == n && memcmp(e->raw, s, (size_t)n) == 0)
            return e;
        i = (i + 1) & mask;
    }
}

static int table_grow(Table *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    Entry *slots = PyMem_Calloc(cap, sizeof(Entry)), *old = t->slots;
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t old_cap = t->cap;
    t->slots = slots;
    t->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].raw != NULL)
            *table_find(t, (const unsigned char *)old[i].raw, old[i].n, old[i].hash) = old[i];
    PyMem_Free(old);
    return 0;
}

static void table_free(Table *t) {
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].raw != NULL) {
            PyMem_Free(t->slots[i].raw);
            Py_XDECREF(t->slots[i].text);
        }
    }
    PyMem_Free(t->slots);
    t->slots = NULL;
    t->cap = t->used = 0;
}

/* The slot of raw bytes ``s`` (hash ``h``) in ``t``: its entry, or the empty slot a new one
   takes (the table grown first where it is half full); NULL on an error. */
static Entry *table_slot(Table *t, const unsigned char *s, Py_ssize_t n, uint64_t h) {
    Entry *e = table_find(t, s, n, h);
    if (e->raw == NULL && t->used * 2 >= t->cap) {
        if (table_grow(t) < 0)
            return NULL;
        e = table_find(t, s, n, h);
    }
    return e;
}

/* Fill the empty slot ``e`` of ``t`` with a copy of ``s`` and its decoded ``text`` (a
   reference it takes, released on an error); 0, or -1 on an error. */
static int table_fill(Table *t, Entry *e, const unsigned char *s, Py_ssize_t n, uint64_t h, PyObject *text,
                      long code, int special) {
    char *raw = PyMem_Malloc(n ? (size_t)n : 1);
    if (raw == NULL) {
        Py_DECREF(text);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(raw, s, (size_t)n);
    e->raw = raw;
    e->n = n;
    e->hash = h;
    e->text = text;
    e->code = code;
    e->special = special;
    e->run = e->new_run = 0;
    e->new_code = -1;
    e->frame = FRAME_UNASKED;
    t->used++;
    return 0;
}

/* The text of a JSON string's raw bytes (already checked by scan_string). */
static PyObject *decode_string(const unsigned char *s, Py_ssize_t n, int escaped) {
    if (!escaped)
        return PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    /* Unescaped UTF-8 is never longer than the escapes: \uXXXX (6) -> at most 3 bytes. */
    char *out = PyMem_Malloc(n ? (size_t)n : 1), *q = out;
    if (out == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n;) {
        unsigned char b = s[i];
        if (b != '\\') {
            *q++ = (char)b;
            i++;
            continue;
        }
        unsigned char x = s[i + 1];
        unsigned u = 0, low = 0;
        i += 2;
        switch (x) {
        case 'b': *q++ = '\b'; continue;
        case 'f': *q++ = '\f'; continue;
        case 'n': *q++ = '\n'; continue;
        case 'r': *q++ = '\r'; continue;
        case 't': *q++ = '\t'; continue;
        case 'u': break;
        default: *q++ = (char)x; continue; /* \" \\ \/ */
        }
        hex4(s + i, &u);
        i += 4;
        if (u >= 0xD800 && u <= 0xDBFF) {
            hex4(s + i + 2, &low);
            i += 6;
            u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
        }
        if (u < 0x80)
            *q++ = (char)u;
        else if (u < 0x800) {
            *q++ = (char)(0xC0 | (u >> 6));
            *q++ = (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            *q++ = (char)(0xE0 | (u >> 12));
            *q++ = (char)(0x80 | ((u >> 6) & 0x3F));
            *q++ = (char)(0x80 | (u & 0x3F));
        } else {
            *q++ = (char)(0xF0 | (u >> 18));
            *q++ = (char)(0x80 | ((u >> 12) & 0x3F));
            *q++ = (char)(0x80 | ((u >> 6) & 0x3F));
            *q++ = (char)(0x80 | (u & 0x3F));
        }
    }
    PyObject *text = PyUnicode_DecodeUTF8(out, q - out, "strict");
    PyMem_Free(out);
    return text;
}

/* -- the scanner ------------------------------------------------------------------------ */

typedef struct {
    int64_t *src, *start, *dur, *pid, *tid, *seq, *corr;
    int32_t *name;
    int8_t *cat;
    Py_ssize_t n, cap;
} Rows;

/* Every column of Rows, for what is done to each alike (grow, free). */
#define ROWS_COLUMNS(X) X(src) X(start) X(dur) X(pid) X(tid) X(seq) X(corr) X(name) X(cat)

/* A run's P2P and collective ops: each one's row in the run and its kind. */
typedef struct {
    int64_t *row;
    int32_t *kind;
    Py_ssize_t n, cap;
} Specials;

#define SPECIALS_COLUMNS(X) X(row) X(kind)

typedef struct {
    int ints, floats;
    double top; /* the largest magnitude */
} Column;

typedef struct {
    PyObject_HEAD
    PyObject *cat_code_of; /* _RowBuilder.cat_code_of (read only) */
    PyObject *cat_code;    /* raw category -> its code, without recording it */
    PyObject *name_codes;  /* _RowBuilder.name_codes (read only) */
    PyObject *special;     /* tuple of the names whose args _special_args reads */
    PyObject *unset;       /* msgspec.UNSET */
    long cpu_op;           /* the category code of cpu_op */
    long frame_code;       /* the code cat_code gives python_function: a frame, kept or not by its name */
    long frame_cat;        /* the category code of a kept frame's row */
    PyObject *keeps_frame; /* a python_function's name -> whether the frame is kept */
    PyObject *frame_endings; /* tuple of bytes: a kept frame's name (UTF-8) ends with one of them */
    Table names, cats;
    Rows rows;
    uint64_t run;
    const char *why;
    /* per run */
    Py_ssize_t n_complete, n_begin_end, first_ts_index;
    Value first_ts;
    Column ts_col, dur_col;
    PyObject *special_ids;  /* _RowBuilder.special_ids (read only): (name, args) -> kind */
    PyObject *special_keys; /* _RowBuilder.special_keys (read only; its length) */
    PyObject *cats_met;     /* list */
    /* the run's P2P and collective ops: rows and kinds, and the kinds new in the run */
    Specials specials;
    Py_ssize_t next_kind;
    PyObject *special_new; /* list of (name, args or None, start, stop) */
    PyObject *new_kinds;   /* (name, args) -> the kind it gets, from len(special_keys) on */
    PyObject *new_codes; /* names not in name_codes -> the codes they get, from name_codes' size on */
    Py_ssize_t next_code;
    KeyMemo element_keys[MEMO_SETS][MEMO_KEYS], args_keys[ARGS_SETS][MEMO_KEYS]; /* the last elements' keys */
    KeyMemo seam; /* the bytes between the last two elements, from after its '}' to the next '{' */
} Scanner;

/* Room for one more item in every column of a table of columns (Rows, Specials), doubling
   them all when full; 0, or -1 on an error. */
#define GROW(field)                                                        \
    {                                                                      \
        void *p = PyMem_Realloc(t->field, (size_t)cap * sizeof *t->field); \
        if (p == NULL) {                                                   \
            PyErr_NoMemory();                                              \
            return -1;                                                     \
        }                                                                  \
        t->field = p;                                                      \
    }
#define FREE(field) PyMem_Free(t->field);
#define COLUMNS_FUNCTIONS(Table, COLUMNS, first_cap, reserve, release) \
    static int reserve(Table *t) {                                     \
        if (t->n < t->cap)                                             \
            return 0;                                                  \
        Py_ssize_t cap = t->cap ? t->cap * 2 : first_cap;              \
        COLUMNS(GROW)                                                  \
        t->cap = cap;                                                  \
        return 0;                                                      \
    }                                                                  \
    static void release(Table *t) {                                    \
        COLUMNS(FREE)                                                  \
        memset(t, 0, sizeof *t);                                       \
    }

COLUMNS_FUNCTIONS(Rows, ROWS_COLUMNS, 1024, rows_reserve, rows_free)
COLUMNS_FUNCTIONS(Specials, SPECIALS_COLUMNS, 256, specials_reserve, specials_free)
#undef COLUMNS_FUNCTIONS
#undef FREE
#undef GROW

/* The code ``key`` was given in this run (``given``: key -> code), or the next one (*next,
   then moved on), recorded there (*is_new set where not NULL); -1 on an error. */
static Py_ssize_t given_or_next(PyObject *given, PyObject *key, Py_ssize_t *next, int *is_new) {
    PyObject *found = PyDict_GetItemWithError(given, key); /* borrowed */
    if (found != NULL) {
        if (is_new != NULL)
            *is_new = 0;
        return PyLong_AsSsize_t(found);
    }
    if (PyErr_Occurred())
        return -1;
    PyObject *code = PyLong_FromSsize_t(*next);
    int failed = code == NULL || PyDict_SetItem(given, key, code) < 0;
    Py_XDECREF(code);
    if (failed)
        return -1;
    if (is_new != NULL)
        *is_new = 1;
    return (*next)++;
}

/* The entry of a category's raw bytes, its code worked out (once) as the builder does. */
static Entry *category(Scanner *self, const unsigned char *s, Py_ssize_t n, int escaped) {
    uint64_t h = hash_bytes(s, n);
    Entry *e = table_slot(&self->cats, s, n, h);
    if (e == NULL || e->raw != NULL)
        return e;
    PyObject *text = decode_string(s, n, escaped);
    if (text == NULL)
        return NULL;
    PyObject *code = PyDict_GetItemWithError(self->cat_code_of, text); /* borrowed */
    if (code != NULL)
        Py_INCREF(code);
    else if (!PyErr_Occurred())
        code = PyObject_CallOneArg(self->cat_code, text);
    long value = code == NULL ? -1 : PyLong_AsLong(code);
    Py_XDECREF(code);
    if (PyErr_Occurred()) {
        Py_DECREF(text);
        return NULL;
    }
    return table_fill(&self->cats, e, s, n, h, text, value, 0) < 0 ? NULL : e;
}

/* The entry of a name's raw bytes, made (its text decoded) where it is new. */
static Entry *name_slot(Scanner *self, const unsigned char *s, Py_ssize_t n, int escaped) {
    uint64_t h = hash_bytes(s, n);
    Entry *e = table_slot(&self->names, s, n, h);
    if (e == NULL)
        return NULL;
    if (e->raw == NULL) {
        PyObject *text = decode_string(s, n, escaped);
        if (text == NULL)
            return NULL;
        int special = PySequence_Contains(self->special, text);
        if (special > 0)
            special = PyUnicode_CompareWithASCIIString(text, "record_param_comms") == 0 ? SPECIAL_NCCL : SPECIAL_P2P;
        if (special < 0) {
            Py_DECREF(text);
            return NULL;
        }
        if (table_fill(&self->names, e, s, n, h, text, -1, special) < 0)
            return NULL;
    }
    return e;
}

/* The entry of a name's raw bytes; its code looked up in name_codes once per run until found. */
static Entry *name_entry(Scanner *self, const unsigned char *s, Py_ssize_t n, int escaped) {
    Entry *e = name_slot(self, s, n, escaped);
    if (e == NULL)
        return NULL;
    if (e->code < 0 && e->run != self->run) {
        e->run = self->run;
        PyObject *code = PyDict_GetItemWithError(self->name_codes, e->text); /* borrowed */
        if (code != NULL) {
            e->code = PyLong_AsLong(code);
            if (e->code == -1 && PyErr_Occurred())
                return NULL;
        } else if (PyErr_Occurred())
            return NULL;
    }
    return e;
}

static const unsigned char EMPTY[1] = {0};

/* Whether raw bytes end with one of ``endings`` (a tuple of bytes). */
static int ends_with_one(PyObject *endings, const unsigned char *s, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(endings); k++) {
        PyObject *ending = PyTuple_GET_ITEM(endings, k);
        Py_ssize_t len = PyBytes_GET_SIZE(ending);
        if (len <= n && memcmp(s + n - len, PyBytes_AS_STRING(ending), (size_t)len) == 0)
            return 1;
    }
    return 0;
}

/* Whether a python_function element is kept: keeps_frame of its name (once per distinct name;
   absent: the empty text; no text: no action frame's, as keeps_frame reads it); -1 on an error.
   Every action frame's name ends with one of frame_endings: a name without escapes that ends
   otherwise (nearly every frame of a with_stack trace) is dropped on its last bytes alone,
   before it is hashed or decoded (a with_stack trace names thousands of distinct calls). */
static int frame_kept(Scanner *self, const Value *name) {
    const unsigned char *s = EMPTY;
    Py_ssize_t n = 0;
    int escaped = 0;
    if (name->kind == V_STRING) {
        s = name->s;
        n = name->n;
        escaped = name->escaped;
    } else if (name->kind != V_ABSENT)
        return 0;
    if (!escaped && !ends_with_one(self->frame_endings, s, n))
        return 0;
    Entry *e = name_slot(self, s, n, escaped);
    if (e == NULL)
        return -1;
    if (e->frame == FRAME_UNASKED) {
        PyObject *answer = PyObject_CallOneArg(self->keeps_frame, e->text);
        int kept = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (kept < 0)
            return -1;
        e->frame = kept ? FRAME_KEPT : FRAME_DROPPED;
    }
    return e->frame == FRAME_KEPT;
}

/* A time in us as int64 ns, as kineto_rows._ns computes it; 0: not one the scanner answers for. */
static int time_ns(const Value *v, int64_t *out, Column *col) {
    double magnitude;
    if (v->kind == V_INT) {
        magnitude = fabs((double)v->i);
        if (!(magnitude < TIME_LIMIT_US))
            return 0;
        *out = v->i * 1000;
        col->ints = 1;
    } else if (v->kind == V_FLOAT) {
        magnitude = fabs(v->f);
        if (!(magnitude < TIME_LIMIT_US))
            return 0;
        *out = (int64_t)rint(v->f * 1000.0);
        col->floats = 1;
    } else
        return 0;
    if (magnitude > col->top)
        col->top = magnitude;
    return 1;
}

/* An id of args as _ints_or_minus_one reads it within any batch; 0: declined. */
static int id_or_minus_one(const Value *v, int64_t *out) {
    switch (v->kind) {
    case V_ABSENT: case V_FLOAT: case V_STRING: case V_NULL:
        *out = -1;
        return 1;
    case V_INT:
        *out = v->i;
        return 1;
    default: /* bools read as ints beside ints, longer ints, lists, objects */
        return 0;
    }
}

/* What kineto_rows._special_args gives for a P2P or collective op's args, where it is plain:
   {} without args; for record_param_comms its six fields as a tuple (UNSET where absent) when
   each is absent, text or an integer of at most 18 digits; for gloo's ops the raw JSON of the
   shape and type lists (b"" where absent). NULL without an error: the Python side decodes
   the element and asks _special_args. */
static PyObject *special_args(Scanner *self, const Element *e, int nccl) {
    if (e->args != V_OBJECT)
        return PyDict_New();
    if (!nccl) {
        PyObject *out = PyTuple_New(3);
        for (int k = 0; out != NULL && k < 3; k++) {
            const Value *raw = &e->arg[A_RAW + k];
            PyObject *text = raw->kind == V_ABSENT ? PyBytes_FromStringAndSize("", 0)
                                                   : PyBytes_FromStringAndSize((const char *)raw->s, raw->n);
            if (text == NULL)
                Py_CLEAR(out);
            else
                PyTuple_SET_ITEM(out, k, text);
        }
        return out;
    }
    for (int k = 0; k < N_NCCL; k++) {
        Kind kind = e->arg[A_NCCL + k].kind;
        if (kind != V_ABSENT && kind != V_INT && kind != V_STRING)
            return NULL;
    }
    PyObject *out = PyTuple_New(N_NCCL);
    for (int k = 0; out != NULL && k < N_NCCL; k++) {
        const Value *v = &e->arg[A_NCCL + k];
        PyObject *item = v->kind == V_ABSENT ? Py_NewRef(self->unset)
                         : v->kind == V_INT  ? PyLong_FromLongLong(v->i)
                                             : decode_string(v->s, v->n, v->escaped);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, k, item);
    }
    return out;
}

/* The entry of an element's text field through lookup (category or name_entry): the empty
   text where it is absent; a field that is not text declines with why. */
static Status text_entry(Scanner *self, Cursor *c, const Value *v,
                         Entry *(*lookup)(Scanner *, const unsigned char *, Py_ssize_t, int), const char *why,
                         Entry **out) {
    if (v->kind == V_ABSENT)
        *out = lookup(self, EMPTY, 0, 0);
    else if (v->kind == V_STRING)
        *out = lookup(self, v->s, v->n, v->escaped);
    else
        DECLINE(c, why);
    return *out == NULL ? ST_ERROR : ST_OK;
}

/* The kind of a P2P or collective op (see _RowBuilder.special_kinds) at ``row`` of the run:
   one of the builder's kinds where its (name, args) is one, else the next (each args the
   Python side decodes is a kind of its own); 0, or -1 on an error. */
static int add_special(Scanner *self, const Element *e, Entry *name, const unsigned char *start,
                       const unsigned char *stop, const unsigned char *base, Py_ssize_t row) {
    PyObject *found = special_args(self, e, name->special == SPECIAL_NCCL);
    if (found == NULL && PyErr_Occurred())
        return -1;
    Py_ssize_t kind = -1;
    int is_new = 1; /* args the Python side decodes: always a kind of their own */
    if (found != NULL && PyTuple_Check(found)) { /* a plain value: a kind met before? */
        PyObject *key = PyTuple_Pack(2, name->text, found);
        PyObject *known = key == NULL ? NULL : PyDict_GetItemWithError(self->special_ids, key);
        if (known != NULL) {
            kind = PyLong_AsSsize_t(known);
            is_new = 0;
        } else if (key != NULL && !PyErr_Occurred())
            kind = given_or_next(self->new_kinds, key, &self->next_kind, &is_new);
        Py_XDECREF(key);
    } else
        kind = self->next_kind++;
    if (kind >= 0 && is_new) {
        PyObject *entry = Py_BuildValue("(OOnn)", name->text, found ? found : Py_None,
                                        found ? (Py_ssize_t)0 : (Py_ssize_t)(start - base),
                                        found ? (Py_ssize_t)0 : (Py_ssize_t)(stop - base));
        if (entry == NULL || PyList_Append(self->special_new, entry) < 0)
            kind = -1;
        Py_XDECREF(entry);
    }
    Py_XDECREF(found);
    if (kind < 0 || specials_reserve(&self->specials) < 0)
        return -1;
    Specials *sp = &self->specials;
    sp->row[sp->n] = row;
    sp->kind[sp->n++] = (int32_t)kind;
    return 0;
}

/* Record one element of the run (its index in the run: index). */
static Status add_element(Scanner *self, Cursor *c, Element *e, const unsigned char *start,
                          const unsigned char *stop, const unsigned char *base, Py_ssize_t index) {
    Rows *r = &self->rows;
    Entry *cat, *name;
    int64_t ts, dur, seq, corr;
    Status st;
    if (e->ph.kind != V_STRING || e->ph.escaped || e->ph.n != 1 ||
        memchr(PHASES, e->ph.s[0], sizeof PHASES - 1) == NULL)
        DECLINE(c, "an element of no known phase");
    if (e->ph.s[0] != 'X') {
        if (e->ph.s[0] == 'B' || e->ph.s[0] == 'E')
            self->n_begin_end++; /* duration events tracekit does not pair: counted, said */
        return ST_OK;
    }
    self->n_complete++;
    if (e->args != V_ABSENT && e->args != V_NULL && e->args != V_OBJECT)
        DECLINE(c, "args that is not an object");
    if ((st = text_entry(self, c, &e->cat, category, "a category that is not text", &cat)) != ST_OK)
        return st;
    if (cat->run != self->run) {
        cat->run = self->run;
        if (PyList_Append(self->cats_met, cat->text) < 0)
            return ST_ERROR;
    }
    if (e->ts.kind == V_INT || e->ts.kind == V_FLOAT) {
        if (self->first_ts_index < 0) {
            self->first_ts_index = index;
            self->first_ts = e->ts;
        }
    } else if (e->ts.kind == V_TRUE || e->ts.kind == V_FALSE || e->ts.kind == V_BIGINT)
        DECLINE(c, "a ts the time base probe would read");
    long cat_code = cat->code;
    if (cat_code == self->frame_code) { /* a Python frame: kept where it names an action */
        int kept = frame_kept(self, &e->name);
        if (kept < 0)
            return ST_ERROR;
        cat_code = kept ? self->frame_cat : -1;
    }
    if (cat_code < 0)
        return ST_OK; /* a category not kept */

    if ((st = text_entry(self, c, &e->name, name_entry, "a name that is not text", &name)) != ST_OK)
        return st;
    if (!time_ns(&e->ts, &ts, &self->ts_col))
        DECLINE(c, "a ts that is no plain number");
    if (e->dur.kind == V_ABSENT) {
        dur = 0;
        self->dur_col.ints = 1;
    } else if (!time_ns(&e->dur, &dur, &self->dur_col))
        DECLINE(c, "a dur that is no plain number");
    if ((e->pid.kind != V_ABSENT && e->pid.kind != V_INT) || (e->tid.kind != V_ABSENT && e->tid.kind != V_INT))
        DECLINE(c, "a pid or tid that is no plain integer");
    if (e->args == V_OBJECT) {
        const Value *used = &e->arg[A_CORR];
        if (used->kind == V_ABSENT || (used->kind == V_INT && used->i == -1) ||
            (used->kind == V_FLOAT && used->f == -1.0))
            used = &e->arg[A_EXT]; /* RawArgs.correlation == -1: the External id */
        if (!id_or_minus_one(&e->arg[A_SEQ], &seq) || !id_or_minus_one(used, &corr))
            DECLINE(c, "an args id that is a bool, a long integer or a container");
    } else
        seq = corr = -1;
    if (name->special && cat->code == self->cpu_op && add_special(self, e, name, start, stop, base, r->n) < 0)
        return ST_ERROR;
    if (rows_reserve(r) < 0)
        return ST_ERROR;
    Py_ssize_t k = r->n++;
    r->src[k] = index;
    r->cat[k] = (int8_t)cat_code;
    if (name->code < 0 && name->new_run != self->run) { /* new to the file: the next code */
        /* by its text: raw bytes escaped otherwise are other entries with the same name */
        Py_ssize_t code = given_or_next(self->new_codes, name->text, &self->next_code, NULL);
        if (code < 0)
            return ST_ERROR;
        name->new_code = (long)code;
        name->new_run = self->run;
    }
    r->name[k] = (int32_t)(name->code >= 0 ? name->code : name->new_code);
    r->start[k] = ts;
    r->dur[k] = dur;
    r->pid[k] = e->pid.kind == V_INT ? e->pid.i : 0;
    r->tid[k] = e->tid.kind == V_INT ? e->tid.i : 0;
    r->seq[k] = seq;
    r->corr[k] = corr;
    return ST_OK;
}

static PyObject *column_bytes(const void *data, Py_ssize_t n, Py_ssize_t itemsize) {
    return PyByteArray_FromStringAndSize((const char *)data, n * itemsize);
}

/* A column mixing ints and floats with large values: numpy would round the ints. */
static int mixed_large(const Column *col) {
    return col->ints && col->floats && col->top >= EXACT_FLOAT_US;
}

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    Py_buffer view;
    int last_run;
    if (!PyArg_ParseTuple(args, "y*p:scan", &view, &last_run))
        return NULL;
    const unsigned char *base = view.buf;
    Cursor c = {base, base + view.len, NULL};
    Py_ssize_t n_elements = 0, end = -1, next = -1;
    Status st = ST_OK;
    PyObject *result = NULL;

    self->run++;
    self->rows.n = 0;
    self->n_complete = 0;
    self->n_begin_end = 0;
    self->first_ts_index = -1;
    memset(&self->ts_col, 0, sizeof self->ts_col);
    memset(&self->dur_col, 0, sizeof self->dur_col);
    self->next_code = PyDict_Size(self->name_codes);
    Py_XSETREF(self->cats_met, PyList_New(0));
    Py_XSETREF(self->special_new, PyList_New(0));
    Py_XSETREF(self->new_kinds, PyDict_New());
    self->specials.n = 0;
    self->next_kind = PyList_GET_SIZE(self->special_keys);
    Py_XSETREF(self->new_codes, PyDict_New());
    if (self->cats_met == NULL || self->special_new == NULL || self->new_kinds == NULL || self->new_codes == NULL)
        goto done;

    skip_ws(&c);
    while (c.p < c.end) {
        Element e;
        const unsigned char *start = c.p, *stop, *following = NULL, *array_end = NULL;
        if (*c.p != '{') {
            st = ST_DECLINE;
            c.why = "an element that is not an object";
            break;
        }
        st = scan_element(&c, &e, self->element_keys, self->args_keys);
        if (st == ST_MORE) { /* the element goes on past the bytes: the run ends before it */
            st = ST_OK;
            break;
        }
        if (st != ST_OK)
            break;
        stop = c.p;
        if (memo_matches(&self->seam, c.p, c.end)) { /* the ',' and whitespace of the last seam, and '{' */
            c.p += self->seam.len - 1;
            following = c.p;
        } else {
            skip_ws(&c);
            if (c.p < c.end && *c.p == ',') {
                c.p++;
                skip_ws(&c);
                if (c.p < c.end && *c.p != '{') {
                    st = ST_DECLINE;
                    c.why = "an element that is not an object";
                    break;
                }
                following = c.p < c.end ? c.p : NULL;
                if (following != NULL)
                    memo_record(&self->seam, stop, following + 1, 0);
            } else if (last_run && c.p < c.end && *c.p == ']')
                array_end = c.p;
        }
        if (following == NULL && array_end == NULL)
            break; /* the run ends before this element: no seam, or no end of the array, after it */
        if ((st = add_element(self, &c, &e, start, stop, base, n_elements)) != ST_OK)
            break;
        n_elements++;
        if (array_end != NULL) {
            end = next = array_end - base;
            break;
        }
        end = stop - base;
        next = following - base;
    }
    if (st == ST_ERROR)
        goto done;
    if (st == ST_OK && n_elements == 0) {
        st = ST_DECLINE;
        c.why = "no whole element yet";
    } else if (st == ST_OK && last_run && end != next) {
        st = ST_DECLINE;
        c.why = "no end of the array after the elements";
    }
    if (st == ST_OK && (mixed_large(&self->ts_col) || mixed_large(&self->dur_col))) {
        st = ST_DECLINE;
        c.why = "ints and large floats in one time column";
    }
    if (st != ST_OK) {
        self->why = c.why;
        result = Py_NewRef(Py_None);
        goto done;
    }
    self->why = NULL;

    Rows *r = &self->rows;
    PyObject *first_ts = Py_None, *names = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (self->first_ts_index >= 0) {
        PyObject *value = self->first_ts.kind == V_INT ? PyLong_FromLongLong(self->first_ts.i)
                                                       : PyFloat_FromDouble(self->first_ts.f);
        Py_SETREF(first_ts, value == NULL ? NULL : Py_BuildValue("(nN)", self->first_ts_index, value));
    }
    if (PyDict_GET_SIZE(self->new_codes))
        Py_SETREF(names, PyDict_Keys(self->new_codes)); /* in the order of their codes */
    if (first_ts != NULL && names != NULL)
        result = Py_BuildValue("{sn sn sn sn sn sO sn sN sN sN sN sN sN sN sN sN sO sO sN sN sO}",
                               "n_elements", n_elements, "end", end, "next", next, "n_complete", self->n_complete,
                               "n_begin_end", self->n_begin_end,
                               "first_ts", first_ts, "n_rows", r->n,
                               "src", column_bytes(r->src, r->n, 8), "cat", column_bytes(r->cat, r->n, 1),
                               "name", column_bytes(r->name, r->n, 4), "start", column_bytes(r->start, r->n, 8),
                               "dur", column_bytes(r->dur, r->n, 8), "pid", column_bytes(r->pid, r->n, 8),
                               "tid", column_bytes(r->tid, r->n, 8), "seq", column_bytes(r->seq, r->n, 8),
                               "corr", column_bytes(r->corr, r->n, 8), "names", names, "cats", self->cats_met,
                               "special_rows", column_bytes(self->specials.row, self->specials.n, 8),
                               "special_kinds", column_bytes(self->specials.kind, self->specials.n, 4),
                               "special_new", self->special_new);
    Py_XDECREF(first_ts);
    Py_XDECREF(names);
done:
    PyBuffer_Release(&view);
    Py_CLEAR(self->cats_met);
    Py_CLEAR(self->special_new);
    Py_CLEAR(self->new_kinds);
    Py_CLEAR(self->new_codes);
    return result;
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"cat_code_of", "cat_code",   "name_codes", "cpu_op",      "special",
                             "unset",       "special_ids", "special_keys", "frame_code", "frame_cat",
                             "keeps_frame", "frame_endings", NULL};
    PyObject *cat_code_of, *cat_code, *name_codes, *special, *unset, *special_ids, *special_keys, *keeps_frame,
        *frame_endings;
    long cpu_op, frame_code, frame_cat;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!lO!OO!O!llOO!:Scanner", kwlist, &PyDict_Type, &cat_code_of,
                                     &cat_code, &PyDict_Type, &name_codes, &cpu_op, &PyTuple_Type, &special, &unset,
                                     &PyDict_Type, &special_ids, &PyList_Type, &special_keys, &frame_code, &frame_cat,
                                     &keeps_frame, &PyTuple_Type, &frame_endings))
        return -1;
    if (self->names.slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner is initialised once");
        return -1;
    }
    Py_XSETREF(self->cat_code_of, Py_NewRef(cat_code_of));
    Py_XSETREF(self->cat_code, Py_NewRef(cat_code));
    Py_XSETREF(self->name_codes, Py_NewRef(name_codes));
    Py_XSETREF(self->special, Py_NewRef(special));
    Py_XSETREF(self->unset, Py_NewRef(unset));
    Py_XSETREF(self->special_ids, Py_NewRef(special_ids));
    Py_XSETREF(self->special_keys, Py_NewRef(special_keys));
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(frame_endings); k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(frame_endings, k))) {
            PyErr_SetString(PyExc_TypeError, "frame_endings holds bytes only");
            return -1;
        }
    }
    Py_XSETREF(self->keeps_frame, Py_NewRef(keeps_frame));
    Py_XSETREF(self->frame_endings, Py_NewRef(frame_endings));
    self->cpu_op = cpu_op;
    self->frame_code = frame_code;
    self->frame_cat = frame_cat;
    if (table_grow(&self->names) < 0 || table_grow(&self->cats) < 0)
        return -1;
    return 0;
}

static void Scanner_dealloc(Scanner *self) {
    Py_XDECREF(self->cat_code_of);
    Py_XDECREF(self->cat_code);
    Py_XDECREF(self->name_codes);
    Py_XDECREF(self->special);
    Py_XDECREF(self->unset);
    Py_XDECREF(self->cats_met);
    Py_XDECREF(self->special_ids);
    Py_XDECREF(self->special_keys);
    Py_XDECREF(self->keeps_frame);
    Py_XDECREF(self->frame_endings);
    Py_XDECREF(self->special_new);
    Py_XDECREF(self->new_kinds);
    Py_XDECREF(self->new_codes);
    specials_free(&self->specials);
    table_free(&self->names);
    table_free(&self->cats);
    rows_free(&self->rows);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Scanner_why(Scanner *self, void *closure) {
    (void)closure;
    if (self->why == NULL)
        Py_RETURN_NONE;
    return PyUnicode_FromString(self->why);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(data, last) -> dict | None\n\n"
     "The rows of the run of traceEvents elements at the front of data, or None where the\n"
     "scanner declines (see why). The run ends at the last element followed by the next\n"
     "one's '{' (last: by the array's ']'), at data[end]; the rest starts at data[next]."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"why", (getter)Scanner_why, NULL, "Why the last scan declined (None: it answered).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tracekit.ingest._kineto_scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(cat_code_of, cat_code, name_codes, cpu_op, special, unset, special_ids, special_keys, "
              "frame_code, frame_cat, keeps_frame, frame_endings): Kineto elements to row columns.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kineto_scan", "The Kineto parser's native scanner (see kineto_native.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__kineto_scan(void) {
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
