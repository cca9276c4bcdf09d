/* kv_append_harness.cu: torch-free test and benchmark of the CUDA KV-cache append (csrc/cuda/kv_append.cu)
 * against the C11 CPU loop (csrc/cpu/kv_append.c), whose results test_kv_append.py checks against Python.
 *
 * Build (here or on the device):
 *   gcc -std=c11 -O2 -fopenmp -Icsrc -c csrc/cpu/kv_append.c -o dev/bin/kv_append_cpu.o
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -Icsrc \
 *        -Icsrc/cuda dev/kv_append_harness.cu csrc/cuda/kv_append.cu dev/bin/kv_append_cpu.o -lgomp \
 *        -o dev/bin/kv_append_harness
 * Run:
 *   kv_append_harness test   random calls (element sizes 2 / 4 / 8; dense, cache_batch_idx, paged; entries
 *                            out of range; rows past the cache; contiguous, (b, h, s, d) and padded caches and new
 *                            rows; misaligned bases): the whole allocation of each cache, guard bytes around it
 *                            included, must equal the CPU loop's byte for byte; one summary line
 *   kv_append_harness time   bf16 decode appends (one new token) per call, CUDA events over 2000 launches
 *
 * Sequences never share a cache row here (tables and batch indices are permutations; a clamped entry takes
 * a page / batch no other entry uses): shared rows race by design (csrc/kv_append.h).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_append.h"
#include "launch.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static int64_t rnd_in(int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(rnd() % (uint32_t)(hi - lo + 1));
}

/* One 4-D tensor (n0, n1, h, d) in a byte buffer with guard bytes before and after: layout 0 contiguous,
 * 1 (n0, h, n1, d) transposed, 2 padded head dim (d + pad); base offset `shift` bytes (a multiple of es). */
typedef struct tensor4 {
    int64_t n0, n1, h, d, es;
    flash_strides s;
    size_t span, offset, bytes; /* elements spanned; byte offset of element 0; buffer bytes */
    uint8_t *host, *dev;
} tensor4;

static const size_t kGuard = 64;

static void make_tensor(tensor4 *t, int64_t n0, int64_t n1, int64_t h, int64_t d, int64_t es, int layout, int shift)
{
    t->n0 = n0, t->n1 = n1, t->h = h, t->d = d, t->es = es;
    const int64_t dp = layout == 2 ? d + rnd_in(1, 5) : d;
    if (layout == 1) {
        t->s.row = dp, t->s.head = n1 * dp, t->s.batch = h * n1 * dp;
    } else {
        t->s.head = dp, t->s.row = h * dp, t->s.batch = n1 * h * dp;
    }
    t->span = (size_t)(n0 * t->s.batch);
    t->offset = kGuard + (size_t)shift * (size_t)es;
    t->bytes = t->offset + t->span * (size_t)es + kGuard;
    t->host = (uint8_t *)malloc(t->bytes);
    for (size_t i = 0; i < t->bytes; i++)
        t->host[i] = (uint8_t)rnd();
    CHECK(cudaMalloc(&t->dev, t->bytes));
    CHECK(cudaMemcpy(t->dev, t->host, t->bytes, cudaMemcpyHostToDevice));
}

static void free_tensor(tensor4 *t)
{
    free(t->host);
    CHECK(cudaFree(t->dev));
}

static int32_t *to_device_i32(const int32_t *x, int64_t n)
{
    int32_t *d = NULL;
    CHECK(cudaMalloc(&d, (size_t)(n > 0 ? n : 1) * sizeof(int32_t)));
    if (n > 0)
        CHECK(cudaMemcpy(d, x, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
}

/* A permutation of [1, n - 2] in `out` (count entries, count <= n - 2), one entry replaced by lo - k (clamps
 * to 0) and maybe one by n - 1 + k (clamps to n - 1): no two entries address the same page / batch. */
static void distinct_entries(int32_t *out, int64_t count, int64_t n)
{
    int64_t m = n - 2;
    int32_t *perm = (int32_t *)malloc((size_t)m * sizeof(int32_t));
    for (int64_t i = 0; i < m; i++)
        perm[i] = (int32_t)(i + 1);
    for (int64_t i = m - 1; i > 0; i--) {
        const int64_t j = rnd_in(0, i);
        const int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t i = 0; i < count; i++)
        out[i] = perm[i];
    free(perm);
    if (count > 0 && rnd() % 2)
        out[rnd_in(0, count - 1)] = (int32_t)-rnd_in(1, 5);
    if (count > 1 && rnd() % 2) {
        int64_t i;
        do
            i = rnd_in(0, count - 1);
        while (out[i] <= 0);
        out[i] = (int32_t)(n - 1 + rnd_in(0, 5));
    }
}

static int run_one(int verbose)
{
    const int64_t es_choices[] = {2, 4, 8};
    const int64_t es = es_choices[rnd() % 3];
    const int64_t batch = rnd_in(1, 5), seqlen_new = rnd() % 8 ? rnd_in(1, 40) : rnd_in(41, 90);
    const int64_t hkv = rnd_in(1, 4);
    const int64_t d = rnd() % 2 ? 8 * rnd_in(1, 16) : rnd_in(1, 70);
    const int64_t d_v = rnd() % 3 ? d : (rnd() % 2 ? 8 * rnd_in(1, 16) : rnd_in(1, 70));
    const int kind = (int)(rnd() % 3); /* 0 dense, 1 cache_batch_idx, 2 paged */
    const int64_t page = kind == 2 ? 16 * rnd_in(1, 2) : 0;
    const int64_t max_pages = kind == 2 ? rnd_in(1, 4) : 0;
    const int64_t n0 = kind == 0 ? batch : kind == 1 ? batch + rnd_in(2, 4) : batch * max_pages + rnd_in(2, 4);
    const int64_t n1 = kind == 2 ? page : rnd_in(1, 70);
    const int64_t seqlen_k = kind == 2 ? max_pages * page : n1;
    const int shift = rnd() % 4 ? 0 : (int)rnd_in(1, 3);
    tensor4 kc, vc, k, v;
    make_tensor(&kc, n0, n1, hkv, d, es, (int)(rnd() % 3), shift);
    make_tensor(&vc, n0, n1, hkv, d_v, es, (int)(rnd() % 3), rnd() % 4 ? 0 : (int)rnd_in(1, 3));
    make_tensor(&k, batch, seqlen_new, hkv, d, es, (int)(rnd() % 3), rnd() % 4 ? 0 : (int)rnd_in(1, 3));
    make_tensor(&v, batch, seqlen_new, hkv, d_v, es, (int)(rnd() % 3), 0);
    int32_t *seqlens = (int32_t *)malloc((size_t)batch * sizeof(int32_t));
    for (int64_t b = 0; b < batch; b++)
        seqlens[b] = (int32_t)(rnd() % 5 ? rnd_in(0, seqlen_k) : rnd_in(-5, seqlen_k + 5));
    int32_t *idx = NULL, *table = NULL;
    if (kind == 1) {
        idx = (int32_t *)malloc((size_t)batch * sizeof(int32_t));
        distinct_entries(idx, batch, n0);
    } else if (kind == 2) {
        table = (int32_t *)malloc((size_t)(batch * max_pages) * sizeof(int32_t));
        distinct_entries(table, batch * max_pages, n0);
    }

    flash_kv_append_params p;
    memset(&p, 0, sizeof(p));
    p.k_cache_s = kc.s, p.v_cache_s = vc.s, p.k_s = k.s, p.v_s = v.s;
    p.batch = batch, p.seqlen_new = seqlen_new, p.nheads_kv = hkv, p.d = d, p.d_v = d_v;
    p.cache_batches = n0, p.page_size = page, p.seqlen_k = seqlen_k, p.elem_size = es;
    p.table_s0 = max_pages, p.table_s1 = 1;
    /* the CPU loop on the host copies */
    p.k_cache = kc.host + kc.offset, p.v_cache = vc.host + vc.offset, p.k = k.host + k.offset, p.v = v.host + v.offset;
    p.cache_seqlens = seqlens, p.cache_batch_idx = idx, p.block_table = table;
    flash_kv_append_cpu(&p);
    /* the kernel on the device copies */
    int32_t *d_seqlens = to_device_i32(seqlens, batch);
    int32_t *d_idx = idx ? to_device_i32(idx, batch) : NULL;
    int32_t *d_table = table ? to_device_i32(table, batch * max_pages) : NULL;
    p.k_cache = kc.dev + kc.offset, p.v_cache = vc.dev + vc.offset, p.k = k.dev + k.offset, p.v = v.dev + v.offset;
    p.cache_seqlens = d_seqlens, p.cache_batch_idx = d_idx, p.block_table = d_table;
    CHECK(flash_kv_append_cuda(&p, 0));
    CHECK(cudaDeviceSynchronize());
    int ok = 1;
    tensor4 *all[] = {&kc, &vc, &k, &v};
    for (int i = 0; i < 4; i++) {
        uint8_t *back = (uint8_t *)malloc(all[i]->bytes);
        CHECK(cudaMemcpy(back, all[i]->dev, all[i]->bytes, cudaMemcpyDeviceToHost));
        if (memcmp(back, all[i]->host, all[i]->bytes) != 0)
            ok = 0;
        free(back);
    }
    if (!ok || verbose)
        printf("%s es=%lld b=%lld new=%lld hkv=%lld d=%lld d_v=%lld kind=%d page=%lld pages=%lld n0=%lld n1=%lld\n",
               ok ? "ok" : "MISMATCH", (long long)es, (long long)batch, (long long)seqlen_new, (long long)hkv,
               (long long)d, (long long)d_v, kind, (long long)page, (long long)max_pages, (long long)n0,
               (long long)n1);
    for (int i = 0; i < 4; i++)
        free_tensor(all[i]);
    free(seqlens), free(idx), free(table);
    CHECK(cudaFree(d_seqlens));
    if (d_idx)
        CHECK(cudaFree(d_idx));
    if (d_table)
        CHECK(cudaFree(d_table));
    return ok;
}

static void time_decode(void)
{
    const int64_t batches[] = {1, 8}, rows[] = {256, 4096}, dims[] = {64, 128};
    printf("| cache | batch | rows | nheads_kv | d | us per call |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (int paged = 0; paged < 2; paged++)
        for (int bi = 0; bi < 2; bi++)
            for (int ri = 0; ri < 2; ri++)
                for (int di = 0; di < 2; di++) {
                    const int64_t batch = batches[bi], n = rows[ri], d = dims[di], hkv = 8, page = 256;
                    const int64_t pages = paged ? n / page : 0, n0 = paged ? batch * pages : batch;
                    const int64_t n1 = paged ? page : n;
                    tensor4 kc, vc, k, v;
                    make_tensor(&kc, n0, n1, hkv, d, 2, 0, 0);
                    make_tensor(&vc, n0, n1, hkv, d, 2, 0, 0);
                    make_tensor(&k, batch, 1, hkv, d, 2, 0, 0);
                    make_tensor(&v, batch, 1, hkv, d, 2, 0, 0);
                    int32_t seqlens[8], table[8 * 16];
                    for (int64_t b = 0; b < batch; b++)
                        seqlens[b] = (int32_t)(n / 2 + b);
                    for (int64_t i = 0; i < batch * pages; i++)
                        table[i] = (int32_t)i;
                    int32_t *d_seqlens = to_device_i32(seqlens, batch);
                    int32_t *d_table = to_device_i32(table, batch * pages);
                    flash_kv_append_params p;
                    memset(&p, 0, sizeof(p));
                    p.k_cache = kc.dev + kc.offset, p.v_cache = vc.dev + vc.offset;
                    p.k = k.dev + k.offset, p.v = v.dev + v.offset;
                    p.k_cache_s = kc.s, p.v_cache_s = vc.s, p.k_s = k.s, p.v_s = v.s;
                    p.cache_seqlens = d_seqlens, p.block_table = paged ? d_table : NULL;
                    p.table_s0 = pages, p.table_s1 = 1;
                    p.batch = batch, p.seqlen_new = 1, p.nheads_kv = hkv, p.d = d, p.d_v = d;
                    p.cache_batches = n0, p.page_size = page, p.seqlen_k = n, p.elem_size = 2;
                    for (int i = 0; i < 100; i++)
                        CHECK(flash_kv_append_cuda(&p, 0));
                    cudaEvent_t e0, e1;
                    CHECK(cudaEventCreate(&e0));
                    CHECK(cudaEventCreate(&e1));
                    const int reps = 2000;
                    CHECK(cudaEventRecord(e0, 0));
                    for (int i = 0; i < reps; i++)
                        CHECK(flash_kv_append_cuda(&p, 0));
                    CHECK(cudaEventRecord(e1, 0));
                    CHECK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    printf("| %s | %lld | %lld | %lld | %lld | %.2f |\n", paged ? "paged" : "dense", (long long)batch,
                           (long long)n, (long long)hkv, (long long)d, 1000.0 * ms / reps);
                    CHECK(cudaEventDestroy(e0));
                    CHECK(cudaEventDestroy(e1));
                    tensor4 *all[] = {&kc, &vc, &k, &v};
                    for (int i = 0; i < 4; i++)
                        free_tensor(all[i]);
                    CHECK(cudaFree(d_seqlens));
                    CHECK(cudaFree(d_table));
                }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "test";
    if (strcmp(mode, "time") == 0) {
        time_decode();
        return 0;
    }
    const int n = argc > 2 ? atoi(argv[2]) : 2000;
    int passed = 0;
    for (int i = 0; i < n; i++)
        passed += run_one(0);
    printf("kv_append_harness test: %d / %d random calls match the CPU loop byte for byte\n", passed, n);
    return passed == n ? 0 : 1;
}
