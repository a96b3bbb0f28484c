/* Own declarations of the parts of NCCL that safecuda uses, and the driver layer's NCCL
 * functions.
 *
 * No NCCL header is needed to build safecuda: the types and signatures below follow NCCL's
 * ABI (nccl.h), which has kept these entry points and types unchanged since 2.14, and the
 * communicator configuration is the layout NCCL 2.18 introduced (ncclConfig_v21700 with
 * splitShare): NCCL reads a config up to the size it declares and keeps its own defaults for
 * the fields that came later, so this layout works with every newer NCCL.
 *
 * libnccl.so.2 is loaded at run time (src/driver/nccl.c). Only src/driver/ calls NCCL; the
 * rest of the library calls the sci_nccl* wrappers declared at the end. */
#ifndef SAFECUDA_DRIVER_NCCL_API_H
#define SAFECUDA_DRIVER_NCCL_API_H

#include <stdbool.h>
#include <stddef.h>

#include "driver/cuda_api.h"
#include "safecuda.h"

typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t;
enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
};

#define SCI_NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[SCI_NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef int ncclDataType_t;
enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,   /* NCCL 2.10 */
    ncclFloat8e4m3 = 10, /* NCCL 2.24.3 */
    ncclFloat8e5m2 = 11
};

typedef int ncclRedOp_t;
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

/* NCCL_CONFIG_INITIALIZER's magic; NCCL_VERSION(X, Y, Z) for X.Y >= 2.9. */
#define SCI_NCCL_CONFIG_MAGIC 0xcafebeefu
#define SCI_NCCL_VERSION(x, y, z) ((x) * 10000 + (y) * 100 + (z))
#define SCI_NCCL_UNDEF_INT (-2147483647 - 1)

/* ncclConfig_t as NCCL 2.18 .. 2.19 declare it (ncclConfig_v21700). */
typedef struct sci_nccl_config {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} sci_nccl_config;

/* The oldest NCCL safecuda loads: 2.19.4. The entry points and the non-blocking mode used
 * here came with 2.14 (ncclCommInitRankConfig, config.blocking = 0, ncclCommFinalize),
 * ncclGetLastError with 2.13; 2.19.4 fixed the two bugs this library would meet: memory
 * leaked by every CUDA graph capture of a collective, and a crash of a grouped all-to-all-v
 * that sends to its own rank (safecuda's all-to-all is grouped send/recv, self included). */
#define SCI_NCCL_MIN_VERSION SCI_NCCL_VERSION(2, 19, 4)
/* The first NCCL with the fp8 types (ncclFloat8e4m3, ncclFloat8e5m2). */
#define SCI_NCCL_FP8_VERSION SCI_NCCL_VERSION(2, 24, 3)

/* X(name, required?, parameter list, argument list); every entry answers ncclResult_t. */
#define SCI_NCCL_FUNCS(X)                                                                      \
    X(ncclGetVersion, 1, (int *version), (version))                                            \
    X(ncclGetUniqueId, 1, (ncclUniqueId * id), (id))                                           \
    X(ncclCommInitRankConfig, 1,                                                               \
      (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, sci_nccl_config *config),     \
      (comm, nranks, id, rank, config))                                                        \
    X(ncclCommFinalize, 1, (ncclComm_t comm), (comm))                                          \
    X(ncclCommDestroy, 1, (ncclComm_t comm), (comm))                                           \
    X(ncclCommAbort, 1, (ncclComm_t comm), (comm))                                             \
    X(ncclCommGetAsyncError, 1, (ncclComm_t comm, ncclResult_t * error), (comm, error))        \
    X(ncclAllReduce, 1,                                                                        \
      (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,        \
       ncclComm_t comm, CUstream stream),                                                      \
      (send, recv, count, type, op, comm, stream))                                             \
    X(ncclReduceScatter, 1,                                                                    \
      (const void *send, void *recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,   \
       ncclComm_t comm, CUstream stream),                                                      \
      (send, recv, recv_count, type, op, comm, stream))                                        \
    X(ncclAllGather, 1,                                                                        \
      (const void *send, void *recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,  \
       CUstream stream),                                                                       \
      (send, recv, send_count, type, comm, stream))                                            \
    X(ncclSend, 1,                                                                             \
      (const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,         \
       CUstream stream),                                                                       \
      (send, count, type, peer, comm, stream))                                                 \
    X(ncclRecv, 1,                                                                             \
      (void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,               \
       CUstream stream),                                                                       \
      (recv, count, type, peer, comm, stream))                                                 \
    X(ncclGroupStart, 1, (void), ())                                                           \
    X(ncclGroupEnd, 1, (void), ())
/* ncclGetErrorString and ncclGetLastError return strings: resolved apart from the table. */

/* Load NCCL once (thread-safe, lazy): SC_OK, or SC_ERR_NO_NCCL when no usable NCCL is
 * there: none found (the message says where it looked and what to install), or one that is
 * too old, is not NCCL or lacks an entry point (the message says which). The message is in
 * sci_nccl_load_message(). Where NCCL is searched: src/driver/nccl.c. */
sc_status sci_nccl_load(void);
const char *sci_nccl_load_message(void);
/* After a load that found a library (even one refused): its path and its version
 * (ncclGetVersion's code: 22809 for 2.28.9; 0 when unknown). */
const char *sci_nccl_library_path(void);
int sci_nccl_version(void);
/* The loaded NCCL is safecuda's test double (tests/ncclfault), which works on the test
 * device's memory only. */
bool sci_nccl_is_test_double(void);
/* "2.28.9" for the version code 22809. */
void sci_nccl_version_text(int code, char *out, size_t size);

/* "ncclInvalidArgument" and NCCL's text for it ("invalid argument", from
 * ncclGetErrorString; a built-in text before NCCL is loaded). Never NULL. */
const char *sci_nccl_error_name(ncclResult_t r);
const char *sci_nccl_error_string(ncclResult_t r);
/* NCCL's last error message (ncclGetLastError), "" when it has none. */
const char *sci_nccl_last_error(ncclComm_t comm);

#define SCI_DECLARE_NCCL(name, req, params, args) ncclResult_t sci_##name params;
SCI_NCCL_FUNCS(SCI_DECLARE_NCCL)
#undef SCI_DECLARE_NCCL

#endif
