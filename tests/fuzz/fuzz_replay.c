/* Replays fuzz inputs without libFuzzer, for builds that can't link it (gcc, valgrind):
 *
 *     fuzz_replay FILE|DIR...
 *
 * runs LLVMFuzzerTestOneInput once per file (every file of a DIR); an invariant failure
 * aborts, as under libFuzzer. The libFuzzer build (fuzz_api, SAFECUDA_FUZZ=ON) does the
 * same when given file paths. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int runs;

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *grown = realloc(buf, cap);
            if (!grown) {
                free(buf);
                fclose(f);
                return 1;
            }
            buf = grown;
        }
        size_t n = fread(buf + size, 1, cap - size, f);
        size += n;
        if (n == 0)
            break;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, size);
    free(buf);
    runs++;
    return 0;
}

static int replay(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz_replay: no such file %s\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return replay_file(path);
    DIR *d = opendir(path);
    if (!d)
        return 1;
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || strcmp(e->d_name, "..") == 0))
            continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode))
            bad |= replay_file(full);
    }
    closedir(d);
    return bad;
}

int main(int argc, char **argv)
{
    int bad = 0;
    for (int i = 1; i < argc; i++)
        bad |= replay(argv[i]);
    printf("fuzz_replay: %d inputs replayed, every invariant held\n", runs);
    return bad;
}
