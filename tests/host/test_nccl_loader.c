/* Loading NCCL: each mode runs in its own process (NCCL is loaded once), with the
 * environment CTest sets for it (tests/CMakeLists.txt). The NCCL test double
 * (tests/ncclfault) stands in for NCCL where a mode needs a loadable one; the "system" mode
 * loads the real libnccl.so.2 where this machine has one (only to read its version: nothing
 * runs on a GPU here). Every refusal: the status and the whole message. Python environments:
 * through VIRTUAL_ENV ("venv") and through the program's path ("program"). */
#define _GNU_SOURCE /* mkdtemp, setenv, symlink */
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"
#include "safecuda/comm.h"

#define CHECK_WHOLE(want)                                                                  \
    do {                                                                                   \
        if (strcmp(sc_last_error(), (want)) != 0) {                                        \
            fprintf(stderr, "%s:%d: message\n  got:  %s\n  want: %s\n", __FILE__, __LINE__, \
                    sc_last_error(), (want));                                              \
            test_failures++;                                                               \
        }                                                                                  \
    } while (0)

/* The library refuses: the same status and message from every entry that loads NCCL. */
static void refused(const char *reason)
{
    char want[8192];
    int v = 12345;
    CHECK_STATUS(sc_comm_library_version(&v), SC_ERR_NO_NCCL);
    CHECK(v == 12345);
    snprintf(want, sizeof want, "sc_comm_library_version: %s", reason);
    CHECK_WHOLE(want);
    char path[64] = "untouched";
    CHECK_STATUS(sc_comm_library_path(path, sizeof path), SC_ERR_NO_NCCL);
    CHECK(strcmp(path, "untouched") == 0);
    snprintf(want, sizeof want, "sc_comm_library_path: %s", reason);
    CHECK_WHOLE(want);
    sc_comm_id id;
    CHECK_STATUS(sc_comm_unique_id(&id), SC_ERR_NO_NCCL);
    snprintf(want, sizeof want, "sc_comm_unique_id: %s", reason);
    CHECK_WHOLE(want);
}

static const char *override_hint =
    "; point the variable at a libnccl.so.2 of NCCL 2.19.4 or newer, or unset it to search "
    "the usual places";

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const char *lib = getenv("SAFECUDA_LIBNCCL");
    char want[8192];
    if (strcmp(mode, "missing") == 0) {
        snprintf(want, sizeof want,
                 "cannot use NCCL from SAFECUDA_LIBNCCL=%s: %s (cannot open shared object "
                 "file: No such file or directory)%s",
                 lib, lib, override_hint);
        refused(want);
    } else if (strcmp(mode, "old") == 0) {
        /* The double reports 2.19.3 (SAFECUDA_NCCLFAULT_VERSION=21903): one patch too old. */
        snprintf(want, sizeof want,
                 "cannot use NCCL from SAFECUDA_LIBNCCL=%s: %s (NCCL 2.19.3 is too old: "
                 "safecuda needs NCCL 2.19.4 or newer, for its non-blocking communicators "
                 "(2.14) and the fixes of 2.19.4 to graph capture and to all-to-all-v with a "
                 "self send)%s",
                 lib, lib, override_hint);
        refused(want);
    } else if (strcmp(mode, "not-nccl") == 0) {
        /* A library that is not NCCL (libm.so.6): named as the dynamic linker found it. */
        void *h = dlopen(lib, RTLD_NOW);
        struct link_map *lm = NULL;
        REQUIRE(h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm);
        snprintf(want, sizeof want,
                 "cannot use NCCL from SAFECUDA_LIBNCCL=%s: %s (not an NCCL library: it lacks "
                 "ncclGetVersion)%s",
                 lib, lm->l_name, override_hint);
        refused(want);
        dlclose(h);
    } else if (strcmp(mode, "no-entry") == 0) {
        snprintf(want, sizeof want,
                 "cannot use NCCL from SAFECUDA_LIBNCCL=%s: %s (NCCL 2.28.9 lacks the entry "
                 "point ncclSend)%s",
                 lib, lib, override_hint);
        refused(want);
    } else if (strcmp(mode, "double") == 0) {
        int v = 0;
        char path[1024] = "";
        CHECK_OK(sc_comm_library_version(&v));
        CHECK(v == 22809);
        CHECK_OK(sc_comm_library_path(path, sizeof path));
        CHECK(strcmp(path, lib) == 0);
        /* Cut to the buffer, NUL-terminated. */
        char small[5];
        CHECK_OK(sc_comm_library_path(small, sizeof small));
        CHECK(strncmp(small, lib, 4) == 0 && small[4] == '\0');
        sc_clear_error();
        CHECK_STATUS(sc_comm_library_path(NULL, 10), SC_ERR_INVALID_ARGUMENT);
        CHECK_WHOLE("sc_comm_library_path: buf is NULL and size is 10: a buffer of at least 1 "
                    "byte is needed");
        CHECK_STATUS(sc_comm_library_path(path, 0), SC_ERR_INVALID_ARGUMENT);
        CHECK_WHOLE("sc_comm_library_path: buf is given and size is 0: a buffer of at least 1 "
                    "byte is needed");
        CHECK_STATUS(sc_comm_library_version(NULL), SC_ERR_INVALID_ARGUMENT);
        CHECK_WHOLE("sc_comm_library_version: argument 'version' is NULL");
        CHECK_STATUS(sc_comm_unique_id(NULL), SC_ERR_INVALID_ARGUMENT);
        CHECK_WHOLE("sc_comm_unique_id: argument 'id' is NULL");
        sc_comm_id a, b;
        CHECK_OK(sc_comm_unique_id(&a));
        CHECK_OK(sc_comm_unique_id(&b));
        CHECK(memcmp(&a, &b, sizeof a) != 0); /* each id new */
        /* The double refuses a real driver: here there is none, so a context can't exist;
         * the pairing refusal with the test device is in the "system" mode. */
    } else if (strcmp(mode, "in-env") == 0) {
        /* Started as <env>/bin/test_nccl_loader (argv[0], a link: how a virtual environment's
         * python3 runs, VIRTUAL_ENV unset): the environment's wheel is found. */
        char path[1024];
        CHECK_OK(sc_comm_library_path(path, sizeof path));
        if (strcmp(path, argv[2]) != 0) {
            fprintf(stderr, "loaded %s, expected %s\n", path, argv[2]);
            test_failures++;
        }
    } else if (strcmp(mode, "venv") == 0 || strcmp(mode, "program") == 0) {
        /* A Python environment holding the nvidia-nccl wheel's layout, with the double in it:
         * found there, SAFECUDA_LIBNCCL unset; through VIRTUAL_ENV ("venv"), or through the
         * path the program was started by ("program": run again as <env>/bin/...). */
        const bool program = strcmp(mode, "program") == 0;
        char dir[] = "/tmp/safecuda-venv-XXXXXX";
        REQUIRE(mkdtemp(dir) != NULL);
        char path[1024], made[1024];
        const char *parts[] = {"bin", "lib", "lib/python3.12", "lib/python3.12/site-packages",
                               "lib/python3.12/site-packages/nvidia",
                               "lib/python3.12/site-packages/nvidia/nccl",
                               "lib/python3.12/site-packages/nvidia/nccl/lib"};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, parts[i]);
            REQUIRE(mkdir(path, 0700) == 0);
        }
        snprintf(made, sizeof made, "%s/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                 dir);
        REQUIRE(argc > 2 && symlink(argv[2], made) == 0);
        char self[1024], exe[1100];
        snprintf(exe, sizeof exe, "%s/bin/test_nccl_loader", dir);
        if (program) {
            ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
            REQUIRE(k > 0);
            self[k] = '\0';
            REQUIRE(symlink(self, exe) == 0);
            pid_t pid = fork();
            REQUIRE(pid >= 0);
            if (pid == 0) {
                unsetenv("VIRTUAL_ENV");
                execl(exe, exe, "in-env", made, (char *)NULL);
                _exit(127);
            }
            int st = 0;
            waitpid(pid, &st, 0);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            unlink(exe);
        } else {
            setenv("VIRTUAL_ENV", dir, 1);
            int v = 0;
            CHECK_OK(sc_comm_library_version(&v));
            CHECK(v == 22809);
            CHECK_OK(sc_comm_library_path(path, sizeof path));
            if (strcmp(path, made) != 0) {
                fprintf(stderr, "loaded %s, expected %s\n", path, made);
                test_failures++;
            }
        }
        unlink(made);
        for (size_t i = sizeof parts / sizeof parts[0]; i-- > 0;) {
            snprintf(path, sizeof path, "%s/%s", dir, parts[i]);
            rmdir(path);
        }
        rmdir(dir);
    } else if (strcmp(mode, "system") == 0) {
        /* The real NCCL of this machine, if it has one: its version, and that the test device
         * (SAFECUDA_LIBCUDA) refuses to run it. */
        int v = 0;
        sc_status s = sc_comm_library_version(&v);
        if (s == SC_ERR_NO_NCCL) {
            printf("test_nccl_loader: skipped: no NCCL on this machine: %s\n", sc_last_error());
            return 77;
        }
        CHECK_OK(s);
        CHECK(v >= 21904);
        char path[1024] = "";
        CHECK_OK(sc_comm_library_path(path, sizeof path));
        CHECK(strstr(path, "libnccl") != NULL);
        printf("test_nccl_loader: NCCL %d at %s\n", v, path);
        sc_context ctx;
        REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
        sc_comm_id id;
        CHECK_OK(sc_comm_unique_id(&id));
        sc_comm comm = {77};
        CHECK_STATUS(sc_comm_create(ctx, &(sc_comm_desc){.unique_id = id, .nranks = 1},
                                    &comm),
                     SC_ERR_NOT_SUPPORTED);
        CHECK(comm.id == 0);
        snprintf(want, sizeof want,
                 "sc_comm_create: the driver is safecuda's test device, which runs no NCCL, and "
                 "%s is a real NCCL (it needs GPUs); host tests on the test device load "
                 "safecuda's NCCL test double (SAFECUDA_LIBNCCL=<build>/tests/ncclfault/"
                 "libsafecuda_ncclfault.so)",
                 path);
        CHECK_WHOLE(want);
        CHECK_OK(sc_context_destroy(ctx));
    } else {
        fprintf(stderr, "test_nccl_loader: unknown mode '%s'\n", mode);
        return 2;
    }
    return test_result("test_nccl_loader");
}
