/* Reductions of the native core: dst = a op b, elementwise, for every dtype and op aioccl supports.
 *
 * Bit-identical to the Python path (numpy's ufuncs, ml_dtypes for bfloat16): float16 and bfloat16 are
 * widened to float, combined, and rounded back to nearest-even once per combine, as numpy and ml_dtypes
 * do; integers wrap. No Python here: the module releases the GIL around every call. */
#ifndef AIOCCL_REDUCE_H
#define AIOCCL_REDUCE_H

#include <stddef.h>
#include <stdint.h>

/* dtype codes: aioccl/dtypes.py's table, in its order (0: no dtype) */
enum { AC_DT_I8 = 1, AC_DT_U8, AC_DT_I32, AC_DT_U32, AC_DT_I64, AC_DT_U64, AC_DT_F16, AC_DT_BF16, AC_DT_F32, AC_DT_F64, AC_DT_LAST = AC_DT_F64 };
/* reduction codes: aioccl.dtypes.ReduceOp's order (0: none) */
enum { AC_OP_SUM = 1, AC_OP_PROD, AC_OP_MIN, AC_OP_MAX, AC_OP_AVG, AC_OP_LAST = AC_OP_AVG };

/* bytes per element of a dtype code, 0 for an unknown one */
size_t ac_itemsize(int dtype);
/* dst[i] = a[i] op b[i] for i < n; dst may be a or b exactly (never a partial overlap). AVG sums.
 * Pointers need no alignment. Returns 0, or -1 for an unknown dtype/op pair. */
int ac_combine(int op, int dtype, void *dst, const void *a, const void *b, size_t n);
/* buf[i] /= divisor for a floating-point dtype (AVG's last step); -1 for another dtype */
int ac_scale(int dtype, void *buf, size_t n, int64_t divisor);

/* the conversions, exposed for tests */
float ac_f16_to_f32(uint16_t h);
uint16_t ac_f32_to_f16(float f);
float ac_bf16_to_f32(uint16_t h);
uint16_t ac_f32_to_bf16(float f);

#endif
