/* Reductions of the native core (see reduce.h). One loop per (dtype, op), written by macros: the loads
 * and stores go through memcpy so unaligned buffers (a registered view at an odd offset) are fine, and
 * the compiler turns them into plain moves. */
#include "reduce.h"

#include <math.h>
#include <string.h>

size_t ac_itemsize(int dtype) {
    switch (dtype) {
    case AC_DT_I8: case AC_DT_U8: return 1;
    case AC_DT_F16: case AC_DT_BF16: return 2;
    case AC_DT_I32: case AC_DT_U32: case AC_DT_F32: return 4;
    case AC_DT_I64: case AC_DT_U64: case AC_DT_F64: return 8;
    default: return 0;
    }
}

/* -- float16 and bfloat16, as numpy (npy_half) and ml_dtypes (Eigen) convert them ------------------- */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ac_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = h & 0x7c00u, sig = h & 0x03ffu;
    if (exp == 0x7c00u)  /* inf or NaN (payload kept) */
        return bits_f32(sign | 0x7f800000u | (sig << 13));
    if (exp == 0) {
        if (sig == 0)
            return bits_f32(sign);
        /* subnormal: normalise */
        int e = -1;
        do { e++; sig <<= 1; } while ((sig & 0x0400u) == 0);
        return bits_f32(sign | (uint32_t)(112 - e) << 23 | (sig & 0x03ffu) << 13);
    }
    return bits_f32(sign | ((exp >> 10) + 112) << 23 | sig << 13);
}

uint16_t ac_f32_to_f16(float value) {  /* numpy's npy_floatbits_to_halfbits: round to nearest even */
    uint32_t f = f32_bits(value);
    uint16_t h_sgn = (uint16_t)((f & 0x80000000u) >> 16);
    uint32_t f_exp = f & 0x7f800000u, f_sig;
    if (f_exp >= 0x47800000u) {  /* overflow, inf or NaN */
        if (f_exp == 0x7f800000u && (f & 0x007fffffu) != 0) {
            uint16_t ret = (uint16_t)(0x7c00u + ((f & 0x007fffffu) >> 13));
            if (ret == 0x7c00u)
                ret++;  /* a NaN whose payload is in the low bits stays a NaN */
            return (uint16_t)(h_sgn + ret);
        }
        return (uint16_t)(h_sgn + 0x7c00u);
    }
    if (f_exp <= 0x38000000u) {  /* subnormal or zero */
        if (f_exp < 0x33000000u)
            return h_sgn;
        f_exp >>= 23;
        f_sig = 0x00800000u + (f & 0x007fffffu);
        f_sig >>= (113 - f_exp);
        if (((f_sig & 0x00003fffu) != 0x00001000u) || (f & 0x000007ffu))
            f_sig += 0x00001000u;
        return (uint16_t)(h_sgn + (uint16_t)(f_sig >> 13));
    }
    uint16_t h_exp = (uint16_t)((f_exp - 0x38000000u) >> 13);
    f_sig = f & 0x007fffffu;
    if ((f_sig & 0x00003fffu) != 0x00001000u)
        f_sig += 0x00001000u;
    return (uint16_t)(h_sgn + h_exp + (uint16_t)(f_sig >> 13));  /* a carry into the exponent is right */
}

float ac_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ac_f32_to_bf16(float f) {  /* Eigen's float_to_bfloat16_rtne, as ml_dtypes uses */
    if (isnan(f))
        return signbit(f) ? 0xffc0u : 0x7fc0u;
    uint32_t u = f32_bits(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* -- the loops ------------------------------------------------------------------------------------ */
#define LD(T, p, i) ({ T v_; memcpy(&v_, (const char *)(p) + (i) * sizeof(T), sizeof(T)); v_; })
#define ST(T, p, i, v) do { T w_ = (v); memcpy((char *)(p) + (i) * sizeof(T), &w_, sizeof(T)); } while (0)

/* integers: arithmetic in the unsigned type of the same width, so overflow wraps as numpy's does */
#define INT_LOOPS(NAME, T, U)                                                                          \
    static void NAME##_sum(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) ST(T, d, i, (T)((U)LD(T, a, i) + (U)LD(T, b, i)));              \
    }                                                                                                  \
    static void NAME##_prod(void *d, const void *a, const void *b, size_t n) {                         \
        for (size_t i = 0; i < n; i++) ST(T, d, i, (T)((U)LD(T, a, i) * (U)LD(T, b, i)));              \
    }                                                                                                  \
    static void NAME##_min(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) { T x = LD(T, a, i), y = LD(T, b, i); ST(T, d, i, x <= y ? x : y); } \
    }                                                                                                  \
    static void NAME##_max(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) { T x = LD(T, a, i), y = LD(T, b, i); ST(T, d, i, x >= y ? x : y); } \
    }

INT_LOOPS(i8, int8_t, uint8_t)
INT_LOOPS(u8, uint8_t, uint8_t)
INT_LOOPS(i32, int32_t, uint32_t)
INT_LOOPS(u32, uint32_t, uint32_t)
INT_LOOPS(i64, int64_t, uint64_t)
INT_LOOPS(u64, uint64_t, uint64_t)

/* floats: numpy's minimum/maximum let a NaN win (the first one if both are) */
#define FLOAT_LOOPS(NAME, T)                                                                           \
    static void NAME##_sum(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) ST(T, d, i, LD(T, a, i) + LD(T, b, i));                         \
    }                                                                                                  \
    static void NAME##_prod(void *d, const void *a, const void *b, size_t n) {                         \
        for (size_t i = 0; i < n; i++) ST(T, d, i, LD(T, a, i) * LD(T, b, i));                         \
    }                                                                                                  \
    static void NAME##_min(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) {                                                               \
            T x = LD(T, a, i), y = LD(T, b, i);                                                        \
            ST(T, d, i, (x <= y || isnan(x)) ? x : y);                                                 \
        }                                                                                              \
    }                                                                                                  \
    static void NAME##_max(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) {                                                               \
            T x = LD(T, a, i), y = LD(T, b, i);                                                        \
            ST(T, d, i, (x >= y || isnan(x)) ? x : y);                                                 \
        }                                                                                              \
    }

FLOAT_LOOPS(f32, float)
FLOAT_LOOPS(f64, double)

/* 16-bit floats: widen, combine in float, round back once (numpy's HALF_* loops, ml_dtypes' ufuncs) */
#define HALF_LOOPS(NAME, TO, FROM, MIN_PICK, MAX_PICK)                                                 \
    static void NAME##_sum(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) ST(uint16_t, d, i, FROM(TO(LD(uint16_t, a, i)) + TO(LD(uint16_t, b, i)))); \
    }                                                                                                  \
    static void NAME##_prod(void *d, const void *a, const void *b, size_t n) {                         \
        for (size_t i = 0; i < n; i++) ST(uint16_t, d, i, FROM(TO(LD(uint16_t, a, i)) * TO(LD(uint16_t, b, i)))); \
    }                                                                                                  \
    static void NAME##_min(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) {                                                               \
            uint16_t x = LD(uint16_t, a, i), y = LD(uint16_t, b, i);                                   \
            float fx = TO(x), fy = TO(y);                                                              \
            ST(uint16_t, d, i, (MIN_PICK) ? x : y);                                                    \
        }                                                                                              \
    }                                                                                                  \
    static void NAME##_max(void *d, const void *a, const void *b, size_t n) {                          \
        for (size_t i = 0; i < n; i++) {                                                               \
            uint16_t x = LD(uint16_t, a, i), y = LD(uint16_t, b, i);                                   \
            float fx = TO(x), fy = TO(y);                                                              \
            ST(uint16_t, d, i, (MAX_PICK) ? x : y);                                                    \
        }                                                                                              \
    }

/* numpy: (x <= y || isnan(x)) ? x : y;  ml_dtypes: (isnan(x) || x < y) ? x : y */
HALF_LOOPS(f16, ac_f16_to_f32, ac_f32_to_f16, fx <= fy || isnan(fx), fx >= fy || isnan(fx))
HALF_LOOPS(bf16, ac_bf16_to_f32, ac_f32_to_bf16, isnan(fx) || fx < fy, isnan(fx) || fx > fy)

typedef void (*loop_fn)(void *, const void *, const void *, size_t);
#define ROW(N) { N##_sum, N##_prod, N##_min, N##_max }
static const loop_fn LOOPS[AC_DT_LAST + 1][4] = {
    [AC_DT_I8] = ROW(i8),   [AC_DT_U8] = ROW(u8),     [AC_DT_I32] = ROW(i32), [AC_DT_U32] = ROW(u32),
    [AC_DT_I64] = ROW(i64), [AC_DT_U64] = ROW(u64),   [AC_DT_F16] = ROW(f16), [AC_DT_BF16] = ROW(bf16),
    [AC_DT_F32] = ROW(f32), [AC_DT_F64] = ROW(f64),
};

int ac_combine(int op, int dtype, void *dst, const void *a, const void *b, size_t n) {
    if (dtype < 1 || dtype > AC_DT_LAST || op < 1 || op > AC_OP_LAST)
        return -1;
    int k = op == AC_OP_AVG ? 0 : op - 1;  /* AVG sums, and divides once at the end */
    if (op == AC_OP_AVG && dtype != AC_DT_F16 && dtype != AC_DT_BF16 && dtype != AC_DT_F32 && dtype != AC_DT_F64)
        return -1;
    LOOPS[dtype][k](dst, a, b, n);
    return 0;
}

int ac_scale(int dtype, void *buf, size_t n, int64_t divisor) {
    switch (dtype) {
    case AC_DT_F16: {
        float by = (float)divisor;
        for (size_t i = 0; i < n; i++) ST(uint16_t, buf, i, ac_f32_to_f16(ac_f16_to_f32(LD(uint16_t, buf, i)) / by));
        return 0;
    }
    case AC_DT_BF16: {
        float by = ac_bf16_to_f32(ac_f32_to_bf16((float)divisor));  /* ml_dtypes divides by a bfloat16 */
        for (size_t i = 0; i < n; i++)
            ST(uint16_t, buf, i, ac_f32_to_bf16(ac_bf16_to_f32(LD(uint16_t, buf, i)) / by));
        return 0;
    }
    case AC_DT_F32: {
        float by = (float)divisor;
        for (size_t i = 0; i < n; i++) ST(float, buf, i, LD(float, buf, i) / by);
        return 0;
    }
    case AC_DT_F64: {
        double by = (double)divisor;
        for (size_t i = 0; i < n; i++) ST(double, buf, i, LD(double, buf, i) / by);
        return 0;
    }
    default:
        return -1;
    }
}
