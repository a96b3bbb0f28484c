/* npy: numpy's .npy files, for bench_moe's --inputs and --save-inputs (a layer measured on
 * the same weights and tokens as another implementation).
 *
 * The format (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte
 * (1.0: a 2-byte little-endian header length; 2.0 and 3.0: 4 bytes), then the header, a
 * Python dict literal such as {'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and ended by '\n', then the elements in C order.
 *
 * The reader takes versions 1.0, 2.0 and 3.0, the dtypes '<u2' (bf16 bit patterns, numpy's
 * uint16), '<f4' (f32) and '<i4' (i32), C order only, and refuses anything else with a
 * message naming the file: a bad magic or version, a header that is not such a dict (a key
 * missing, repeated or unknown, a value of the wrong kind, no '\n' at its end), another
 * dtype (big-endian, structured, ...), fortran_order True, a shape whose element count
 * overflows, and a file whose size is not the header plus exactly the shape's bytes
 * (truncated, or bytes after the data). The writer makes version 1.0 files, the header
 * padded with spaces so the data starts at a multiple of 64 bytes, as numpy writes them
 * (numpy.load reads them).
 *
 * Plain C11 and POSIX stdio (fseeko/ftello: files over 2 GiB), no safecuda: the host test
 * (tests/host/test_npy.c) links it alone. */
#ifndef SAFECUDA_BENCH_NPY_H
#define SAFECUDA_BENCH_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8

typedef struct npy_file {
    FILE *f;
    const char *path;            /* as given to npy_open (kept, not copied): for messages */
    char descr[8];               /* "<u2", "<f4" or "<i4" */
    size_t elem_size;            /* 2 or 4 */
    int ndim;                    /* 0 .. NPY_MAX_DIMS */
    uint64_t shape[NPY_MAX_DIMS];
    uint64_t count;              /* elements: the product of the shape (1 for ndim 0) */
    uint64_t data_offset;        /* bytes before the first element */
    uint64_t next;               /* the next element npy_read gives */
} npy_file;

/* Open path and validate its magic, version, header and size (see above). false with the
 * reason, naming the file, in err (and nothing to close) on any refusal. */
bool npy_open(npy_file *n, const char *path, char *err, size_t err_size);

/* Whether the open file holds descr ("<u2", "<f4", "<i4") with exactly the given shape
 * (ndim entries); false with a message naming the file, what it holds and what was
 * expected. what names the tensor's role (e.g. "W13 [E, 2I, H]"), or NULL. */
bool npy_expect(const npy_file *n, const char *descr, int ndim, const uint64_t *shape,
                const char *what, char *err, size_t err_size);

/* Read the next `elems` elements (in C order) into dst; false (with the reason) when the
 * file ends early or a read fails, or more elements are asked for than remain. */
bool npy_read(npy_file *n, void *dst, uint64_t elems, char *err, size_t err_size);

void npy_close(npy_file *n);

/* "(3, 4)", "(5,)", "()": a shape as numpy writes it (for messages and headers). */
void npy_shape_text(int ndim, const uint64_t *shape, char *buf, size_t size);

typedef struct npy_writer {
    FILE *f;
    const char *path;
    size_t elem_size;
    uint64_t count;   /* elements the header promises */
    uint64_t written; /* elements written so far */
} npy_writer;

/* Create (or truncate) path and write the header of a C-order array of descr ("<u2",
 * "<f4", "<i4") and shape. false with the reason on a bad dtype or shape or an I/O error. */
bool npy_create(npy_writer *w, const char *path, const char *descr, int ndim,
                const uint64_t *shape, char *err, size_t err_size);

/* Append elems elements from src; false when that is more than the header promised or the
 * write fails. */
bool npy_write(npy_writer *w, const void *src, uint64_t elems, char *err, size_t err_size);

/* Close the file; false (the file removed) when fewer elements were written than the
 * header promised or closing fails. */
bool npy_finish(npy_writer *w, char *err, size_t err_size);

/* Close and remove a file being written (after another failure). */
void npy_abandon(npy_writer *w);

#endif
