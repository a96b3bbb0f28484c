/* The CUDA driver's error codes that safecuda knows, with their names and the driver's own
 * descriptions (as cuGetErrorString gives them): the one list that the CUresult enum
 * (cuda_api.h), the loader's built-in table (libcuda.c, used when no driver answers) and
 * the test device (testdevice/testdevice.c) are all made from.
 *
 * SCI_CU_ERRORS(X) calls X(name, value, text) once per code. */
#ifndef SAFECUDA_DRIVER_CU_ERRORS_H
#define SAFECUDA_DRIVER_CU_ERRORS_H

#define SCI_CU_ERRORS(X)                                                                    \
    X(CUDA_SUCCESS, 0, "no error")                                                          \
    X(CUDA_ERROR_INVALID_VALUE, 1, "invalid argument")                                      \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2, "out of memory")                                         \
    X(CUDA_ERROR_NOT_INITIALIZED, 3, "initialization error")                                \
    X(CUDA_ERROR_DEINITIALIZED, 4, "driver shutting down")                                  \
    X(CUDA_ERROR_STUB_LIBRARY, 34, "CUDA driver is a stub library")                         \
    X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, 36, "API call requires a newer CUDA driver")   \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, 46, "CUDA-capable device(s) is/are busy or unavailable") \
    X(CUDA_ERROR_NO_DEVICE, 100, "no CUDA-capable device is detected")                      \
    X(CUDA_ERROR_INVALID_DEVICE, 101, "invalid device ordinal")                             \
    X(CUDA_ERROR_INVALID_IMAGE, 200, "device kernel image is invalid")                      \
    X(CUDA_ERROR_INVALID_CONTEXT, 201, "invalid device context")                            \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209,                                                    \
      "no kernel image is available for execution on the device")                           \
    X(CUDA_ERROR_ECC_UNCORRECTABLE, 214, "uncorrectable ECC error encountered")             \
    X(CUDA_ERROR_INVALID_PTX, 218, "a PTX JIT compilation failed")                          \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222,                                              \
      "the provided PTX was compiled with an unsupported toolchain.")                       \
    X(CUDA_ERROR_CONTAINED, 226, "container error")                                         \
    X(CUDA_ERROR_INVALID_SOURCE, 300, "device kernel source is invalid")                    \
    X(CUDA_ERROR_FILE_NOT_FOUND, 301, "file not found")                                     \
    X(CUDA_ERROR_INVALID_HANDLE, 400, "invalid resource handle")                            \
    X(CUDA_ERROR_ILLEGAL_STATE, 401, "the operation cannot be performed in the present state") \
    X(CUDA_ERROR_NOT_FOUND, 500, "named symbol not found")                                  \
    X(CUDA_ERROR_NOT_READY, 600, "device not ready")                                        \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, 700, "an illegal memory access was encountered")          \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701, "too many resources requested for launch")   \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, 702, "the launch timed out and was terminated")            \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709, "context is destroyed")                         \
    X(CUDA_ERROR_ASSERT, 710, "device-side assert triggered")                               \
    X(CUDA_ERROR_HARDWARE_STACK_ERROR, 714, "hardware stack error")                         \
    X(CUDA_ERROR_ILLEGAL_INSTRUCTION, 715, "an illegal instruction was encountered")        \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, 716, "misaligned address")                             \
    X(CUDA_ERROR_INVALID_ADDRESS_SPACE, 717,                                                \
      "operation not supported on global/shared address space")                             \
    X(CUDA_ERROR_INVALID_PC, 718, "invalid program counter")                                \
    X(CUDA_ERROR_LAUNCH_FAILED, 719, "unspecified launch failure")                          \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720, "too many blocks in cooperative launch") \
    X(CUDA_ERROR_NOT_PERMITTED, 800, "operation not permitted")                             \
    X(CUDA_ERROR_NOT_SUPPORTED, 801, "operation not supported")                             \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 803,                                               \
      "system has unsupported display driver / cuda driver combination")                    \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900,                                          \
      "operation not permitted when stream is capturing")                                   \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901,                                          \
      "operation failed due to a previous error during capture")                           \
    X(CUDA_ERROR_STREAM_CAPTURE_MERGE, 902, "operation would result in a merge of separate capture sequences") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903, "capture was not ended in the same stream as it began") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904,                                             \
      "capturing stream has unjoined work")                                                 \
    X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 905,                                            \
      "dependency created on uncaptured work in another stream")                           \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906,                                             \
      "operation would make the legacy stream depend on a capturing blocking stream")      \
    X(CUDA_ERROR_CAPTURED_EVENT, 907,                                                      \
      "operation not permitted on an event last recorded in a capturing stream")           \
    X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908,                                         \
      "attempt to terminate a thread-local capture sequence from another thread")          \
    X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, 910,                                           \
      "the graph update was not performed because it included changes which violated "     \
      "constraints specific to instantiated graph update")                                  \
    X(CUDA_ERROR_INVALID_CLUSTER_SIZE, 912,                                                \
      "a kernel launch error has occurred due to cluster misconfiguration")                \
    X(CUDA_ERROR_UNKNOWN, 999, "unknown error")

#endif
