/* Interop (internal): borrowed buffers and DLPack, shared by borrow.c and dlpack.c. */
#ifndef SAFECUDA_INTEROP_INTEROP_H
#define SAFECUDA_INTEROP_INTEROP_H

#include "memory/buffer.h"
#include "safecuda/interop.h"

/* sc_buffer_borrow_at with fn naming the public function in messages (sc_buffer_borrow,
 * sc_buffer_from_dlpack). On failure *buffer is zero and release is not called. */
sc_status sci_buffer_borrow(sc_context ctx, uint64_t device_ptr, const sc_borrow_desc *desc,
                            sc_buffer *buffer, const char *file, int line, const char *fn);

#endif
