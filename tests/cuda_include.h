/* The CUDA toolkit's include folder, for test kernels that #include a toolkit header under
 * NVRTC (<cuda_fp8.h>, say): NVRTC itself searches no folder, so the tests pass -I<folder>.
 * Looked for, in order, in $CUDA_HOME/include and $CUDA_PATH/include; beside the NVRTC
 * that safecuda loaded (its lib folder's ../include: a toolkit's, where the system resolves
 * a linked lib64 to targets/<arch>/lib, and the CUDA 13 wheels' nvidia/cu13; and
 * ../../cuda_runtime/include, the CUDA 12 wheels' layout); then /usr/local/cuda/include, the toolkit's targets folders and
 * /opt/cuda/include. */
#ifndef SAFECUDA_TESTS_CUDA_INCLUDE_H
#define SAFECUDA_TESTS_CUDA_INCLUDE_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safecuda.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Whether dir/header exists; then dir is copied into out. */
static inline bool cuda_include_try_(const char *dir, const char *header, char *out,
                                     size_t size)
{
    char path[PATH_MAX + 64];
    if (!dir || !dir[0] || strlen(dir) >= size)
        return false;
    snprintf(path, sizeof path, "%s/%s", dir, header);
    if (access(path, R_OK) != 0)
        return false;
    snprintf(out, size, "%s", dir);
    return true;
}

/* Try the include folders next to the lib folder of the library at lib_path. */
static inline bool cuda_include_near_(const char *lib_path, const char *header, char *out,
                                      size_t size)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", lib_path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return false;
    *slash = '\0'; /* the lib folder */
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof cand, "%s/../include", dir);
    if (cuda_include_try_(cand, header, out, size))
        return true;
    snprintf(cand, sizeof cand, "%s/../../cuda_runtime/include", dir);
    return cuda_include_try_(cand, header, out, size);
}

/* Find the folder holding header (e.g. "cuda_fp8.h"); false when there is none. */
static inline bool cuda_include_find(const char *header, char *out, size_t size)
{
    const char *envs[] = {"CUDA_HOME", "CUDA_PATH"};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        const char *e = getenv(envs[i]);
        char cand[PATH_MAX + 16];
        if (e && e[0]) {
            snprintf(cand, sizeof cand, "%s/include", e);
            if (cuda_include_try_(cand, header, out, size))
                return true;
        }
    }
    char lib[PATH_MAX];
    if (sc_compiler_path(lib, sizeof lib) == SC_OK) {
        if (cuda_include_near_(lib, header, out, size))
            return true;
    }
    static const char *const fixed[] = {
        "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include",
        "/usr/local/cuda/targets/sbsa-linux/include", "/opt/cuda/include",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (cuda_include_try_(fixed[i], header, out, size))
            return true;
    return false;
}

#endif
