/* A 64-bit non-cryptographic hash (FNV-1a with a final avalanche) for cache keys and
 * checksums. Keys combine two differently seeded hashes into 128 bits. */
#ifndef SAFECUDA_COMPILE_HASH_H
#define SAFECUDA_COMPILE_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct sci_hash {
    uint64_t a, b;
} sci_hash;

static inline void sci_hash_init(sci_hash *h)
{
    h->a = 0xcbf29ce484222325ull;
    h->b = 0x84222325cbf29ce4ull ^ 0x9e3779b97f4a7c15ull;
}

static inline void sci_hash_bytes(sci_hash *h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t a = h->a, b = h->b;
    for (size_t i = 0; i < n; i++) {
        a = (a ^ p[i]) * 0x100000001b3ull;
        b = (b ^ p[i]) * 0x00000100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
    h->a = a;
    h->b = b;
}

/* Strings are hashed with their length, so ("ab","c") and ("a","bc") differ. */
static inline void sci_hash_str(sci_hash *h, const char *s)
{
    uint64_t n = 0;
    if (s)
        while (s[n])
            n++;
    sci_hash_bytes(h, &n, sizeof n);
    if (n)
        sci_hash_bytes(h, s, n);
}

static inline uint64_t sci_hash_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline sci_hash sci_hash_final(const sci_hash *h)
{
    sci_hash out = {sci_hash_mix(h->a), sci_hash_mix(h->b ^ h->a)};
    return out;
}

static inline uint64_t sci_checksum(const void *data, size_t n)
{
    sci_hash h;
    sci_hash_init(&h);
    sci_hash_bytes(&h, data, n);
    return sci_hash_final(&h).a;
}

#endif
