/* The strict JSON syntax check (RFC 8259; docs/formats.md, section 1), shared by the batch check
 * (_json_check.c) and the native scanner (_kineto.c), which runs it as it reads when the batch was cut
 * without a check. It accepts a subset of what msgspec accepts: arrays and objects nested at most
 * MAX_DEPTH deep, no \u escape of a UTF-16 surrogate. What it refuses, msgspec judges.
 */
#ifndef TRACELAKE_JSON_CHECK_H
#define TRACELAKE_JSON_CHECK_H

#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    const unsigned char *p, *end;
} Cursor;

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static inline int is_hex(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The bytes of ``w`` that are '"', '\\' or below 0x20 (control characters), as their high bits. */
static inline uint64_t special_bytes(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    return (((quote - ONES) & ~quote) | ((slash - ONES) & ~slash) | ((w - ONES * 0x20) & ~w)) & HIGHS;
}

/* At the opening quote; on success, just past the closing one, with ``*esc`` set where the string
 * holds a backslash escape (left as it was where it holds none). */
static inline int check_string(Cursor *c, int *esc) {
    const unsigned char *p = c->p + 1, *end = c->end;
    for (;;) {
        while (end - p >= 8) { /* eight bytes at a time up to the first one that matters */
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t hits = special_bytes(w);
            if (hits) {
                p += __builtin_ctzll(hits) >> 3;
                break;
            }
            p += 8;
        }
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
        if (p >= end || *p < 0x20) return 0;
        if (*p == '"') {
            c->p = p + 1;
            return 1;
        }
        if (p + 1 >= end) return 0;
        *esc = 1;
        unsigned char e = p[1];
        if (e == 'u') {
            if (p + 6 > end || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5])) return 0;
            /* D800-DFFF: a surrogate; msgspec checks the pairs, and says where they go wrong */
            if ((p[2] == 'd' || p[2] == 'D') && (p[3] >= '8' && p[3] <= '9')) return 0;
            if ((p[2] == 'd' || p[2] == 'D') && ((p[3] >= 'a' && p[3] <= 'f') || (p[3] >= 'A' && p[3] <= 'F'))) return 0;
            p += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            p += 2;
        } else {
            return 0;
        }
    }
}

static inline int check_number(Cursor *c) {
    const unsigned char *p = c->p, *end = c->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 1;
}

static inline int check_literal(Cursor *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static int check_value(Cursor *c, int depth);

/* At '{' or '['; on success, just past the closing bracket. */
static int check_container(Cursor *c, int depth) {
    if (depth >= MAX_DEPTH) return 0;
    unsigned char close = *c->p == '{' ? '}' : ']';
    int object = close == '}';
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    for (;;) {
        skip_ws(c);
        if (object) {
            int esc = 0;
            if (c->p >= c->end || *c->p != '"' || !check_string(c, &esc)) return 0;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') return 0;
            c->p++;
            skip_ws(c);
        }
        if (!check_value(c, depth + 1)) return 0;
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p != close) return 0;
        c->p++;
        return 1;
    }
}

static int check_value(Cursor *c, int depth) {
    if (c->p >= c->end) return 0;
    switch (*c->p) {
    case '{':
    case '[':
        return check_container(c, depth);
    case '"': {
        int esc = 0;
        return check_string(c, &esc);
    }
    case 't':
        return check_literal(c, "true", 4);
    case 'f':
        return check_literal(c, "false", 5);
    case 'n':
        return check_literal(c, "null", 4);
    default:
        return check_number(c);
    }
}

/* After an element of the top-level array: the rest of the array ((, element)* ]) and only whitespace
 * after it; ``*count`` grows by the elements read. */
static inline int check_array_rest(Cursor *c, int64_t *count) {
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == ']') break;
        if (*c->p != ',') return 0;
        c->p++;
        skip_ws(c);
        if (!check_value(c, 1)) return 0;
        (*count)++;
    }
    c->p++;
    skip_ws(c);
    return c->p == c->end;
}

#endif
