/* The driver layer: the only code that loads or calls libcuda and NVRTC.
 *
 * sci_driver_load() / sci_nvrtc_load() load the libraries once (thread-safe, lazy) and
 * return SC_OK or SC_ERR_NO_DRIVER / SC_ERR_NO_COMPILER; the reason (what was tried,
 * what to install) is then in sci_driver_load_message() / sci_nvrtc_load_message().
 * The rest of the library calls the sci_cu* / sci_nvrtc* wrappers of cuda_api.h. */
#ifndef SAFECUDA_DRIVER_DRIVER_H
#define SAFECUDA_DRIVER_DRIVER_H

#include <stdbool.h>

#include "driver/cuda_api.h"
#include "safecuda.h"

/* The CUDA version whose ABI cuda_api.h declares: the oldest driver safecuda accepts. */
#define SCI_CUDA_MIN_VERSION 12000

sc_status sci_driver_load(void);
const char *sci_driver_load_message(void);
/* After a successful load: the driver's CUDA version, the library's path, and whether
 * cuInit found devices (false: the driver works but sees no GPU). */
int sci_driver_cuda_version(void);
const char *sci_driver_library_path(void);
bool sci_driver_has_devices(void);
/* Whether an optional entry point (required = 0 in the table) was found. */
bool sci_driver_has_param_info(void);
/* cuTensorMapEncodeTiled is there (CUDA 12.0+ drivers). */
bool sci_driver_has_tensor_maps(void);
/* cuLaunchKernelEx is there (CUDA 12.0+ drivers). */
bool sci_driver_has_launch_ex(void);
/* The driver is safecuda's test device, which loads modules from PTX text only: programs
 * compiled for its contexts are PTX. */
bool sci_driver_ptx_only(void);

sc_status sci_nvrtc_load(void);
const char *sci_nvrtc_load_message(void);
const char *sci_nvrtc_library_path(void);
const char *sci_nvrtc_error_string(nvrtcResult r);
/* Whether NVRTC can return cubin (nvrtcGetCUBIN) and the architectures it supports. */
bool sci_nvrtc_has_cubin(void);
bool sci_nvrtc_supports_arch(int sm);
/* The architectures NVRTC reported (ascending as NVRTC gives them); 0 when it can't say. */
int sci_nvrtc_archs(const int **list);

/* "CUDA_ERROR_ILLEGAL_ADDRESS" and the driver's description; a built-in table answers
 * when the driver is not loaded. Never NULL. */
const char *sci_cu_error_name(CUresult r);
const char *sci_cu_error_string(CUresult r);
/* Errors after which the context (and, per the CUDA documentation, the process) can do
 * no more device work. */
bool sci_cu_error_is_sticky(CUresult r);

/* ---- fault injection (tests only) ----------------------------------------------------
 * Make the nth call (1-based, counted from now) of entry point `name` ("cuMemAlloc",
 * "nvrtcCompileProgram", ...; "*" for any entry point) return `error` instead of calling
 * through. Every call of the armed entry point(s) is counted while armed (nth = 0 only
 * counts). Returns false if the name is unknown. */
bool sci_fault_arm(const char *name, uint64_t nth, int error);
void sci_fault_disarm(void);
/* Calls of the armed entry point(s) since arming, whether the fault was delivered, and
 * the entry point that received it. */
uint64_t sci_fault_calls(void);
bool sci_fault_fired(void);
const char *sci_fault_last_name(void);

#endif
