/* wgmma_check.cu: checks the wgmma wrappers and sw128 descriptors of csrc/cuda/wgmma.cuh on one
 * warpgroup against a double CPU reference, for the three operand forms the sm90 backward uses:
 *   1. SS, A and B K-major              (S^T = K Q^T)       m64 n64,  K = 128 (two panels)
 *   2. RS, B MN-major                   (dV += P^T dO)      m64 n128, K = 64
 *   3. SS, A and B MN-major, 2nd panel  (dQ = dS K)         m64 n64,  K = 128
 * Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda dev/wgmma_check.cu
 * Prints the max abs error per form (on the H200: 6e-7, 2e-7, 6e-7, PASS). */
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <vector>

#include "common.cuh"
#include "wgmma.cuh"

typedef __nv_bfloat16 bf16;

/* A: (64, 128) row-major, B: (128, 128) row-major, X: (128, 128) row-major; outputs fp32. */
__global__ void check_kernel(const bf16 *A, const bf16 *B, const bf16 *X, float *out1, float *out2, float *out3)
{
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sA = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023); /* 64-row tile  */
    uint8_t *sB = sA + 64 * 128 * 2;                                             /* 128-row tile */
    uint8_t *sT = sB + 128 * 128 * 2;                                            /* 128-row tile */
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32;
    /* sA: A as a 64-row sw128 tile; sB: first 64 rows of B (form 1: rows = N = 64), then reloaded */
    for (int i = tid; i < 64 * 128; i += 128)
        *(bf16 *)(sA + sw128_offset(64, i / 128, i % 128)) = A[i];
    for (int i = tid; i < 64 * 128; i += 128)
        *(bf16 *)(sB + sw128_offset(64, i / 128, i % 128)) = B[i];
    fence_proxy_async();
    __syncthreads();
    float d1[32];
    for (int i = 0; i < 32; ++i) d1[i] = 0.f;
    wgmma_fence();
    for (int kk = 0; kk < 8; ++kk)
        wgmma_op<bf16, 64>::ss<0, 0>(d1, desc_k_major<64>(smem_u32(sA), 0, kk * 16), desc_k_major<64>(smem_u32(sB), 0, kk * 16), 1);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 8; ++i)
        for (int e = 0; e < 4; ++e)
            out1[(w * 16 + lane / 4 + 8 * (e >> 1)) * 64 + i * 8 + 2 * (lane % 4) + (e & 1)] = d1[4 * i + e];
    __syncthreads();
    /* form 2: A = first 64 columns of A (64 x 64) in registers; B = X rows 0..63 (K) x 128 cols (N) */
    for (int i = tid; i < 64 * 128; i += 128)
        *(bf16 *)(sB + sw128_offset(64, i / 128, i % 128)) = X[i];
    fence_proxy_async();
    __syncthreads();
    float d2[64];
    for (int i = 0; i < 64; ++i) d2[i] = 0.f;
    uint32_t a[4][4];
    for (int kq = 0; kq < 4; ++kq) {
        const int r = w * 16 + lane / 4, c = kq * 16 + 2 * (lane % 4);
        a[kq][0] = *(const uint32_t *)(A + r * 128 + c);
        a[kq][1] = *(const uint32_t *)(A + (r + 8) * 128 + c);
        a[kq][2] = *(const uint32_t *)(A + r * 128 + c + 8);
        a[kq][3] = *(const uint32_t *)(A + (r + 8) * 128 + c + 8);
    }
    wgmma_fence();
    for (int kq = 0; kq < 4; ++kq)
        wgmma_op<bf16, 128>::rs<1>(d2, a[kq], desc_mn_major<64>(smem_u32(sB), kq * 16, 0), 1);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 16; ++i)
        for (int e = 0; e < 4; ++e)
            out2[(w * 16 + lane / 4 + 8 * (e >> 1)) * 128 + i * 8 + 2 * (lane % 4) + (e & 1)] = d2[4 * i + e];
    __syncthreads();
    /* form 3: At = B (128 rows = K, 128 cols; M = cols 64..127), Bt = X (128 x 128; N = cols 64..127) */
    for (int i = tid; i < 128 * 128; i += 128) {
        *(bf16 *)(sT + sw128_offset(128, i / 128, i % 128)) = B[i];
        *(bf16 *)(sB + sw128_offset(128, i / 128, i % 128)) = X[i];
    }
    fence_proxy_async();
    __syncthreads();
    float d3[32];
    for (int i = 0; i < 32; ++i) d3[i] = 0.f;
    wgmma_fence();
    for (int kk = 0; kk < 8; ++kk)
        wgmma_op<bf16, 64>::ss<1, 1>(d3, desc_mn_major<128>(smem_u32(sT), kk * 16, 64), desc_mn_major<128>(smem_u32(sB), kk * 16, 64), 1);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 8; ++i)
        for (int e = 0; e < 4; ++e)
            out3[(w * 16 + lane / 4 + 8 * (e >> 1)) * 64 + i * 8 + 2 * (lane % 4) + (e & 1)] = d3[4 * i + e];
}

int main()
{
    std::vector<bf16> hA(64 * 128), hB(128 * 128), hX(128 * 128);
    std::vector<double> fA(64 * 128), fB(128 * 128), fX(128 * 128);
    unsigned s = 12345;
    auto rnd = [&]() { s = s * 1664525u + 1013904223u; return ((s >> 8) & 0xffff) / 65536.0 - 0.5; };
    for (int i = 0; i < 64 * 128; ++i) { hA[i] = __float2bfloat16((float)rnd()); fA[i] = __bfloat162float(hA[i]); }
    for (int i = 0; i < 128 * 128; ++i) { hB[i] = __float2bfloat16((float)rnd()); fB[i] = __bfloat162float(hB[i]); }
    for (int i = 0; i < 128 * 128; ++i) { hX[i] = __float2bfloat16((float)rnd()); fX[i] = __bfloat162float(hX[i]); }
    bf16 *A, *B, *X; float *o1, *o2, *o3;
    cudaMalloc(&A, hA.size() * 2); cudaMalloc(&B, hB.size() * 2); cudaMalloc(&X, hX.size() * 2);
    cudaMalloc(&o1, 64 * 64 * 4); cudaMalloc(&o2, 64 * 128 * 4); cudaMalloc(&o3, 64 * 64 * 4);
    cudaMemcpy(A, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(X, hX.data(), hX.size() * 2, cudaMemcpyHostToDevice);
    const int smem = 1024 + (64 + 128 + 128) * 128 * 2;
    cudaFuncSetAttribute(check_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    check_kernel<<<1, 128, smem>>>(A, B, X, o1, o2, o3);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) { printf("kernel error: %s\n", cudaGetErrorString(err)); return 1; }
    std::vector<float> r1(64 * 64), r2(64 * 128), r3(64 * 64);
    cudaMemcpy(r1.data(), o1, r1.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r2.data(), o2, r2.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r3.data(), o3, r3.size() * 4, cudaMemcpyDeviceToHost);
    double e1 = 0, e2 = 0, e3 = 0;
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 64; ++n) {
            double ref = 0; for (int k = 0; k < 128; ++k) ref += fA[m * 128 + k] * fB[n * 128 + k];
            e1 = fmax(e1, fabs(ref - r1[m * 64 + n]));
            double ref3 = 0; for (int k = 0; k < 128; ++k) ref3 += fB[k * 128 + 64 + m] * fX[k * 128 + 64 + n];
            e3 = fmax(e3, fabs(ref3 - r3[m * 64 + n]));
        }
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 128; ++n) {
            double ref = 0; for (int k = 0; k < 64; ++k) ref += fA[m * 128 + k] * fX[k * 128 + n];
            e2 = fmax(e2, fabs(ref - r2[m * 128 + n]));
        }
    printf("wgmma_check: 1 SS K-major %.2e | 2 RS B MN-major %.2e | 3 SS MN-major panel 2 %.2e  -> %s\n", e1, e2, e3,
           (e1 < 1e-3 && e2 < 1e-3 && e3 < 1e-3) ? "PASS" : "FAIL");
    return 0;
}
