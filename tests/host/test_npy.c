/* bench/npy.c, the .npy reader and writer of bench_moe's --inputs / --save-inputs, without a
 * GPU: round trips of each dtype and shape kind (the header byte for byte as numpy writes
 * it), headers numpy or other writers make that must be read (version 2.0 and 3.0, other
 * key orders, double quotes, 16-byte padding, Python 2's 3L), and every refusal with a
 * message naming the file and the reason. */
#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../bench/npy.h"
#include "../test.h"

static char dir[256];

static const char *path_of(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* A file of exactly these bytes. */
static void raw_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(bytes, 1, n, f) == n);
    REQUIRE(fclose(f) == 0);
}

/* A .npy file by hand: magic, version major.minor, the length (2 bytes for 1.x, else 4), the
 * header text as given (padded with spaces to align bytes when align > 0, then '\n'
 * appended when newline), then data_bytes bytes of 0xA5. */
static void hand_npy(const char *path, int major, int minor, const char *dict, size_t align,
                     bool newline, size_t data_bytes)
{
    unsigned char buf[4096];
    size_t pre = 6 + 2 + (major == 1 ? 2 : 4), dn = strlen(dict);
    size_t hlen = dn + (newline ? 1 : 0);
    if (align)
        hlen += (align - (pre + hlen) % align) % align;
    REQUIRE(pre + hlen + data_bytes <= sizeof buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = (unsigned char)minor;
    for (size_t i = 0; i < pre - 8; i++)
        buf[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + pre, dict, dn);
    memset(buf + pre + dn, ' ', hlen - dn);
    if (newline)
        buf[pre + hlen - 1] = '\n';
    memset(buf + pre + hlen, 0xA5, data_bytes);
    raw_file(path, buf, pre + hlen + data_bytes);
}

/* npy_open refuses name with a message holding the file's path and needle. */
static void check_refused(const char *name, const char *needle, int line)
{
    const char *path = path_of(name);
    npy_file n;
    char err[512] = "";
    bool ok = npy_open(&n, path, err, sizeof err);
    if (ok) {
        fprintf(stderr, "%s:%d: %s was read, expected a refusal (%s)\n", __FILE__, line, name,
                needle);
        test_failures++;
        npy_close(&n);
        return;
    }
    if (!strstr(err, path) || !strstr(err, needle)) {
        fprintf(stderr, "%s:%d: %s: message lacks the path or \"%s\": %s\n", __FILE__, line,
                name, needle, err);
        test_failures++;
    }
    CHECK(n.f == NULL);
}
#define REFUSED(name, needle) check_refused(name, needle, __LINE__)

static void test_round_trips(void)
{
    char err[512] = "";
    /* bf16 bit patterns, 2-D, written in two pieces, read in three. */
    uint16_t a[3 * 5];
    for (int i = 0; i < 15; i++)
        a[i] = (uint16_t)(0x3f80 + 37 * i);
    const uint64_t sa[2] = {3, 5};
    npy_writer w;
    REQUIRE(npy_create(&w, path_of("a.npy"), "<u2", 2, sa, err, sizeof err));
    CHECK(npy_write(&w, a, 4, err, sizeof err));
    CHECK(npy_write(&w, a + 4, 11, err, sizeof err));
    CHECK(npy_finish(&w, err, sizeof err));

    /* The header as numpy.save writes it (format 1.0, dict, spaces, '\n', 64-byte total). */
    FILE *f = fopen(path_of("a.npy"), "rb");
    REQUIRE(f);
    unsigned char head[128];
    REQUIRE(fread(head, 1, sizeof head, f) == sizeof head);
    fclose(f);
    const char dict[] = "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 5), }";
    CHECK(memcmp(head, "\x93NUMPY\x01\x00", 8) == 0);
    CHECK(head[8] == 118 && head[9] == 0); /* 10 + 118 = 128 */
    CHECK(memcmp(head + 10, dict, sizeof dict - 1) == 0);
    for (size_t i = 10 + sizeof dict - 1; i < 127; i++)
        CHECK(head[i] == ' ');
    CHECK(head[127] == '\n');

    npy_file n;
    REQUIRE(npy_open(&n, path_of("a.npy"), err, sizeof err));
    CHECK(strcmp(n.descr, "<u2") == 0 && n.elem_size == 2);
    CHECK(n.ndim == 2 && n.shape[0] == 3 && n.shape[1] == 5 && n.count == 15);
    CHECK(n.data_offset == 128);
    CHECK(npy_expect(&n, "<u2", 2, sa, "W", err, sizeof err));
    uint16_t back[15] = {0};
    CHECK(npy_read(&n, back, 7, err, sizeof err));
    CHECK(npy_read(&n, back + 7, 8, err, sizeof err));
    CHECK(memcmp(a, back, sizeof a) == 0);
    CHECK(!npy_read(&n, back, 1, err, sizeof err)); /* nothing left */
    CHECK(strstr(err, "a.npy") && strstr(err, "0 of 15 left"));
    /* The wrong expectations, each named. */
    const uint64_t s35[2] = {5, 3}, s3[1] = {15};
    CHECK(!npy_expect(&n, "<u2", 2, s35, "W13 [E, 2I, H]", err, sizeof err));
    CHECK(strstr(err, "a.npy") && strstr(err, "holds <u2 (3, 5), expected <u2 (5, 3)") &&
          strstr(err, "W13 [E, 2I, H]"));
    CHECK(!npy_expect(&n, "<u2", 1, s3, NULL, err, sizeof err));
    CHECK(strstr(err, "expected <u2 (15,)"));
    CHECK(!npy_expect(&n, "<f4", 2, sa, NULL, err, sizeof err));
    CHECK(strstr(err, "expected <f4 (3, 5)"));
    npy_close(&n);
    npy_close(&n); /* twice is harmless */

    /* f32, 1-D: the header says (7,). */
    float b[7] = {1.5f, -2.f, 0.f, 3.25f, -0.f, 1e-30f, 6e30f};
    const uint64_t sb[1] = {7};
    REQUIRE(npy_create(&w, path_of("b.npy"), "<f4", 1, sb, err, sizeof err));
    CHECK(npy_write(&w, b, 7, err, sizeof err));
    CHECK(npy_finish(&w, err, sizeof err));
    REQUIRE(npy_open(&n, path_of("b.npy"), err, sizeof err));
    CHECK(n.ndim == 1 && n.shape[0] == 7 && n.elem_size == 4 && n.data_offset % 64 == 0);
    float bb[7];
    CHECK(npy_read(&n, bb, 7, err, sizeof err));
    CHECK(memcmp(b, bb, sizeof b) == 0);
    npy_close(&n);
    char text[64];
    npy_shape_text(1, sb, text, sizeof text);
    CHECK(strcmp(text, "(7,)") == 0);

    /* i32, 3-D with a zero dimension, and a 0-D scalar. */
    const uint64_t sc[3] = {2, 0, 4};
    REQUIRE(npy_create(&w, path_of("c.npy"), "<i4", 3, sc, err, sizeof err));
    CHECK(npy_finish(&w, err, sizeof err));
    REQUIRE(npy_open(&n, path_of("c.npy"), err, sizeof err));
    CHECK(n.ndim == 3 && n.count == 0 && strcmp(n.descr, "<i4") == 0);
    npy_close(&n);
    int32_t s = -123456;
    REQUIRE(npy_create(&w, path_of("d.npy"), "<i4", 0, NULL, err, sizeof err));
    CHECK(npy_write(&w, &s, 1, err, sizeof err));
    CHECK(npy_finish(&w, err, sizeof err));
    REQUIRE(npy_open(&n, path_of("d.npy"), err, sizeof err));
    int32_t sb2 = 0;
    CHECK(n.ndim == 0 && n.count == 1 && npy_read(&n, &sb2, 1, err, sizeof err) && sb2 == s);
    npy_close(&n);
    npy_shape_text(0, NULL, text, sizeof text);
    CHECK(strcmp(text, "()") == 0);

    /* The writer's refusals: another dtype, too many or too few elements. */
    CHECK(!npy_create(&w, path_of("e.npy"), "<f8", 1, sb, err, sizeof err));
    CHECK(strstr(err, "e.npy") && strstr(err, "'<f8'"));
    CHECK(access(path_of("e.npy"), F_OK) != 0);
    REQUIRE(npy_create(&w, path_of("e.npy"), "<f4", 1, sb, err, sizeof err));
    CHECK(!npy_write(&w, bb, 8, err, sizeof err));
    CHECK(strstr(err, "room for 7"));
    CHECK(npy_write(&w, bb, 6, err, sizeof err));
    CHECK(!npy_finish(&w, err, sizeof err));
    CHECK(strstr(err, "6 of 7 elements written") && strstr(err, "removed"));
    CHECK(access(path_of("e.npy"), F_OK) != 0);
    REQUIRE(npy_create(&w, path_of("e.npy"), "<f4", 1, sb, err, sizeof err));
    npy_abandon(&w);
    CHECK(access(path_of("e.npy"), F_OK) != 0);
}

/* Headers other writers make, read the same. */
static void test_other_headers(void)
{
    char err[512] = "";
    npy_file n;
    /* Format 2.0 (4-byte length), keys in another order, no trailing ", ", 16-byte padding. */
    hand_npy(path_of("v2.npy"), 2, 0, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
             16, true, 24);
    CHECK(npy_open(&n, path_of("v2.npy"), err, sizeof err));
    CHECK(n.ndim == 2 && n.shape[0] == 2 && n.shape[1] == 3 && n.elem_size == 4);
    CHECK(n.data_offset % 16 == 0);
    unsigned char d[24];
    CHECK(npy_read(&n, d, 6, err, sizeof err) && d[0] == 0xA5 && d[23] == 0xA5);
    npy_close(&n);
    /* Format 3.0, double quotes, Python 2's long integers, no padding at all. */
    hand_npy(path_of("v3.npy"), 3, 0,
             "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (4L,), }", 0, true, 16);
    CHECK(npy_open(&n, path_of("v3.npy"), err, sizeof err));
    CHECK(n.ndim == 1 && n.shape[0] == 4 && strcmp(n.descr, "<i4") == 0);
    npy_close(&n);
}

static void test_refusals(void)
{
    const char *ok = "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }";
    REFUSED("missing.npy", "can't open");
    raw_file(path_of("empty.npy"), "", 0);
    REFUSED("empty.npy", "not a .npy file");
    raw_file(path_of("text.npy"), "hello, world\n", 13);
    REFUSED("text.npy", "not a .npy file");
    hand_npy(path_of("v4.npy"), 4, 0, ok, 64, true, 8);
    REFUSED("v4.npy", "format version 4.0");
    hand_npy(path_of("v11.npy"), 1, 1, ok, 64, true, 8);
    REFUSED("v11.npy", "format version 1.1");
    raw_file(path_of("shortlen.npy"), "\x93NUMPY\x02\x00\x10", 9);
    REFUSED("shortlen.npy", "ends inside the header length");
    raw_file(path_of("zerolen.npy"), "\x93NUMPY\x01\x00\x00\x00", 10);
    REFUSED("zerolen.npy", "header length 0");
    raw_file(path_of("hugelen.npy"), "\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
    REFUSED("hugelen.npy", "header length");
    raw_file(path_of("shorthdr.npy"), "\x93NUMPY\x01\x00\x40\x00{'descr'", 19);
    REFUSED("shorthdr.npy", "ends inside the header");
    hand_npy(path_of("nonl.npy"), 1, 0, ok, 0, false, 8);
    REFUSED("nonl.npy", "newline");
    /* Version 1.0 headers (64-byte aligned, newline-ended) that name a file npy_open must
     * refuse, each with its data bytes and the message's needle. */
    static const struct {
        const char *name, *dict;
        size_t data_bytes;
        const char *needle;
    } bad[] = {
        {"list.npy", "['<u2', False, (2, 2)]", 8, "not a dict"},
        {"noshape.npy", "{'descr': '<u2', 'fortran_order': False, }", 8, "lacks 'shape'"},
        {"nodescr.npy", "{'fortran_order': False, 'shape': (4,), }", 8, "lacks 'descr'"},
        {"noorder.npy", "{'descr': '<u2', 'shape': (4,), }", 8, "lacks 'fortran_order'"},
        {"twice.npy", "{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (4,), }",
         8, "repeats 'descr'"},
        {"extra.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'align': 1, }",
         8, "unexpected key 'align'"},
        {"bigend.npy", "{'descr': '>u2', 'fortran_order': False, 'shape': (4,), }",
         8, "dtype '>u2' is not read"},
        {"f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
         8, "dtype '<f8' is not read"},
        {"bf16v.npy", "{'descr': '<V2', 'fortran_order': False, 'shape': (4,), }",
         8, "numpy.uint16"},
        {"struct.npy", "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (4,), }",
         8, "not a string"},
        {"fortran.npy", "{'descr': '<u2', 'fortran_order': True, 'shape': (2, 2), }",
         8, "fortran_order is True"},
        {"order1.npy", "{'descr': '<u2', 'fortran_order': 1, 'shape': (2, 2), }",
         8, "not True or False"},
        {"int5.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4), }",
         8, "without a comma"},
        {"neg.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (-1, 4), }",
         8, "non-negative integers"},
        {"float.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (2.0, 2), }",
         8, "not a tuple of integers"},
        {"notuple.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': [2, 2], }",
         8, "'shape' is not a tuple"},
        {"ninedims.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
         2, "more than 8 dimensions"},
        {"overflow.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
         8, "overflow"},
        {"bytesoverflow.npy",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
         8, "overflow"},
        {"toolong.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
         8, "too large"},
        {"trail.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), } x",
         8, "follows the header's dict"},
        {"nocomma.npy", "{'descr': '<u2' 'fortran_order': False, 'shape': (2, 2), }",
         8, "no ',' or '}' after the header's 'descr'"},
        {"nocolon.npy", "{'descr' '<u2', }", 8, "no ':'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hand_npy(path_of(bad[i].name), 1, 0, bad[i].dict, 64, true, bad[i].data_bytes);
        check_refused(bad[i].name, bad[i].needle, __LINE__);
    }
    hand_npy(path_of("truncated.npy"), 1, 0, ok, 64, true, 7);
    REFUSED("truncated.npy", "truncated: 135 bytes");
    hand_npy(path_of("trailing.npy"), 1, 0, ok, 64, true, 9);
    REFUSED("trailing.npy", "1 bytes after the data");
    hand_npy(path_of("fine.npy"), 1, 0, ok, 64, true, 8); /* the same header, 8 bytes: read */
    npy_file n;
    char err[512];
    CHECK(npy_open(&n, path_of("fine.npy"), err, sizeof err));
    npy_close(&n);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_npy_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(dir));
    test_round_trips();
    test_other_headers();
    test_refusals();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", dir);
    return test_result("test_npy");
}
