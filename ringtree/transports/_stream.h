/* stream_copy: m bytes from src to dst with 16-byte non-temporal (streaming) stores after
 * a head that aligns dst, a memcpy'd tail, and an sfence so that the stores are visible
 * before the caller's next synchronisation publishes them; plain memcpy off x86-64.
 * Shared by the LL kernel (_llc.c: what a rank writes into the segment for its peers, a
 * large gather's output) and the single-copy module (_cma.c: the own block of a large
 * all-gather): docs/design-notes.md, "Streaming stores into the segment". */
#ifndef RINGTREE_STREAM_H
#define RINGTREE_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline void stream_copy(char *dst, const char *src, size_t m)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15, i = 0;
    if (head > m)
        head = m;
    memcpy(dst, src, head);
    dst += head, src += head, m -= head;
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

#endif
