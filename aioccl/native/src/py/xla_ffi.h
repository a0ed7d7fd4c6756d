/* jax_ext's XLA custom calls (xla_ffi.c): built when jaxlib's FFI headers were found at build time. */
#ifndef AIOCCL_XLA_FFI_H
#define AIOCCL_XLA_FFI_H

#include <Python.h>

/* adds ffi_site, ffi_member, ffi_learn, ffi_handlers, ffi_stats and FFI_API to the module */
int acpy_xla_ffi_ready(PyObject *module);

#endif
