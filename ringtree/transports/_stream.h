/* stream_copy: m bytes from src to dst with 16-byte non-temporal (streaming) stores after
 * a head that aligns dst, a memcpy'd tail, and an sfence so that the stores are visible
 * before the caller's next synchronisation publishes them; plain memcpy off x86-64.
 * Shared by the LL kernel (_llc.c: what a rank writes into the segment for its peers, a
 * large gather's output) and the single-copy module (_cma.c: the own block of a large
 * all-gather): docs/design-notes.md, "Streaming stores into the segment".
 *
 * 4 KiB aliasing: a load whose address matches a pending store's in the low 12 bits
 * waits for it. When dst lies just above src modulo 4 KiB, the next loads met the
 * streamed stores just issued: on one core an 8 MiB copy took 1.5-7x as long at 16-64
 * bytes as at 0, a 1 MiB one 1.7-2x. So the loads run 128 bytes ahead of the stores,
 * and a copy of at most STREAM_ALIAS_MAX bytes with dst 1 to STREAM_ALIAS - 1 bytes
 * above src is a memcpy (in cache, where the aliasing costs most). A larger one stays
 * streamed: it is bound by memory, and with the lead its cost matched distance 0
 * (an all-gather's 8 MiB own block at 16 bytes: memcpy 1.34x, the old loop 1.14-1.18x)
 * (docs/design-notes.md, "Streamed copies and 4 KiB aliasing"). */
#ifndef RINGTREE_STREAM_H
#define RINGTREE_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>

#define STREAM_ALIAS 48           /* dst - src (mod 4096) in (0, STREAM_ALIAS): memcpy, */
#define STREAM_ALIAS_MAX (1 << 20) /* up to this many bytes (beyond, memory-bound anyway) */

/* 128 bytes at p into (from) the eight registers r0..r7 */
#define STREAM_LOAD8(r, p)                                                                 \
    do {                                                                                   \
        const __m128i *q_ = (const __m128i *)(p);                                          \
        r##0 = _mm_loadu_si128(q_), r##1 = _mm_loadu_si128(q_ + 1);                        \
        r##2 = _mm_loadu_si128(q_ + 2), r##3 = _mm_loadu_si128(q_ + 3);                    \
        r##4 = _mm_loadu_si128(q_ + 4), r##5 = _mm_loadu_si128(q_ + 5);                    \
        r##6 = _mm_loadu_si128(q_ + 6), r##7 = _mm_loadu_si128(q_ + 7);                    \
    } while (0)
/* the eight registers r0..r7 into 128 bytes at p (16-byte aligned) with `st`:
 * _mm_store_si128 (through the caches) or _mm_stream_si128 (non-temporal) */
#define STORE8(st, p, r)                                                                   \
    do {                                                                                   \
        __m128i *q_ = (__m128i *)(p);                                                      \
        st(q_, r##0), st(q_ + 1, r##1), st(q_ + 2, r##2), st(q_ + 3, r##3);                \
        st(q_ + 4, r##4), st(q_ + 5, r##5), st(q_ + 6, r##6), st(q_ + 7, r##7);            \
    } while (0)
#define STREAM_STORE8(p, r) STORE8(_mm_stream_si128, p, r)
#define CACHE_STORE8(p, r) STORE8(_mm_store_si128, p, r)

/* the copy's body, dst 16-byte aligned: 128-byte blocks with the loads a block ahead of
 * the stores (a holds the 128 bytes at i, b the next), streamed or through the caches;
 * returns the bytes copied (a multiple of 128, 0 below 384) */
static inline size_t lead_copy(char *dst, const char *src, size_t m, int stream)
{
    size_t i = 0;
    if (m < 384)
        return 0;
    __m128i a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7;
    STREAM_LOAD8(a, src);
    for (; i + 384 <= m; i += 256) {
        STREAM_LOAD8(b, src + i + 128);
        if (stream)
            STREAM_STORE8(dst + i, a);
        else
            CACHE_STORE8(dst + i, a);
        STREAM_LOAD8(a, src + i + 256);
        if (stream)
            STREAM_STORE8(dst + i + 128, b);
        else
            CACHE_STORE8(dst + i + 128, b);
    }
    if (stream)
        STREAM_STORE8(dst + i, a);
    else
        CACHE_STORE8(dst + i, a);
    return i + 128;
}
#endif

static inline void stream_copy(char *dst, const char *src, size_t m)
{
#if defined(__x86_64__)
    size_t near = ((uintptr_t)dst - (uintptr_t)src) & 4095, head, i;
    if (near > 0 && near < STREAM_ALIAS && m <= STREAM_ALIAS_MAX) {
        memcpy(dst, src, m);
        return;
    }
    head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > m)
        head = m;
    memcpy(dst, src, head);
    dst += head, src += head, m -= head;
    i = lead_copy(dst, src, m, 1);
    for (; i + 64 <= m; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, m - i);
    _mm_sfence();
#else
    memcpy(dst, src, m);
#endif
}

/* cached_copy: m bytes from src to dst through the caches, the same loop as stream_copy
 * (dst aligned by a head, loads 128 bytes ahead of the stores) with ordinary stores, at
 * any distance of dst from src modulo 4 KiB. Not memcpy: on a CPU with fast `rep movsb`
 * glibc copies from 4 KiB to the L2's size with it, and on an AMD Zen 3 it ran 2-3.5x
 * slower when dst and src differed in their offset within a cache line (a NumPy array's
 * data lies 16 bytes into its pages, the segment's cells at 0: docs/design-notes.md,
 * "Copies at a NumPy array's offset"). */
static inline void cached_copy(char *dst, const char *src, size_t m)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15, i;
    if (m < 256) {
        memcpy(dst, src, m);
        return;
    }
    memcpy(dst, src, head);
    dst += head, src += head, m -= head;
    i = lead_copy(dst, src, m, 0);
    for (; i + 16 <= m; i += 16)
        _mm_store_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
    memcpy(dst + i, src + i, m - i);
#else
    memcpy(dst, src, m);
#endif
}

#endif
