/* The disk cache of compiled images. An entry holds the image and the lowered names of
 * the program's name expressions, with its key and checksums: a corrupt, truncated or
 * foreign entry is detected and reported as a miss. Entries are written to a temporary
 * file in the same folder and renamed into place, so a reader sees a whole entry or none,
 * and concurrent writers of one entry can't corrupt it. */
#ifndef SAFECUDA_COMPILE_CACHE_H
#define SAFECUDA_COMPILE_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "compile/hash.h"

typedef struct sci_cache_entry {
    bool is_ptx;
    char *image;       /* malloc'd; PTX is NUL-terminated (the NUL is in image_size) */
    size_t image_size;
    size_t n_names;
    char **exprs;      /* malloc'd arrays of malloc'd strings */
    char **lowered;
} sci_cache_entry;

void sci_cache_entry_free(sci_cache_entry *e);

/* The cache folder ("" when the cache is off: SAFECUDA_CACHE=0 or no usable folder; a folder
 * that can't be used is said once through the log). */
const char *sci_cache_dir(void);

/* The cache folder as the environment names it, made if needed: true with dir; false with
 * dir ("" when none is configured) and why in problem ("off: SAFECUDA_CACHE=0", "no
 * folder: ...", "SAFECUDA_CACHE_DIR=D can't be used: Not a directory", ...). */
bool sci_cache_state(char *dir, size_t dir_size, char *problem, size_t problem_size);

/* The folder the environment names (SAFECUDA_CACHE_DIR, else $XDG_CACHE_HOME/safecuda,
 * else ~/.cache/safecuda) into dir, without creating it; false (dir "") when the cache is
 * off (SAFECUDA_CACHE=0) or none of those variables is set. */
bool sci_cache_dir_configured(char *dir, size_t size);

/* Create the folder and its parents (mkdir -p); -1 with errno on failure, ENOTDIR when
 * the path is a file. */
int sci_cache_mkdir(const char *path);

/* The entry's file for a key, in the cache folder or in dir ("" when dir is ""). */
void sci_cache_path(sci_hash key, char *path, size_t size);
void sci_cache_path_in(const char *dir, sci_hash key, char *path, size_t size);

/* Load the entry; false on a miss (absent, corrupt, truncated or foreign). */
bool sci_cache_load(const char *path, sci_hash key, sci_cache_entry *out);

/* Store the entry (best effort: false, with errno, if it could not be written). */
bool sci_cache_store(const char *path, sci_hash key, const sci_cache_entry *e);

#endif
