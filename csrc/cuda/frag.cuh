/* frag.cuh: where an accumulator fragment's values sit in their tile, as (row, column) offsets from the
 * lane's first element (compile-time constants per value, so that a per-element test or bias on them
 * folds to one operation against a per-thread value).
 *
 * mma.sync m16n8 C / D fragment (4 fp32 values per lane): value v = 2 h + e is row lane / 4 + 8 h, column
 * 2 (lane % 4) + e of the 16 x 8 tile.
 * wgmma m64nN D fragment (N / 2 fp32 values per lane): value v = 4 i + 2 h + e is row 16 (warp % 4) +
 * lane / 4 + 8 h, column 8 i + 2 (lane % 4) + e of the 64 x N tile.
 */
#ifndef FLASHATTN_EXT_FRAG_CUH
#define FLASHATTN_EXT_FRAG_CUH

#define FRAG_QUAD_LANES 4 /* lanes per row of a fragment */
#define FRAG_HALF_ROWS 8  /* rows between a lane's h = 0 and h = 1 values */
#define FRAG_N8 8         /* columns of an n8 block */

/* mma.sync C fragment: the lane's first element, and value v's offset from it. */
__host__ __device__ constexpr int mma_c_lane_row(int lane) { return lane / FRAG_QUAD_LANES; }
__host__ __device__ constexpr int mma_c_lane_col(int lane) { return 2 * (lane % FRAG_QUAD_LANES); }
__host__ __device__ constexpr int mma_c_row(int v) { return FRAG_HALF_ROWS * (v >> 1); }
__host__ __device__ constexpr int mma_c_col(int v) { return v & 1; }

/* wgmma D fragment: value v's offset from the lane's first element (row 16 (warp % 4) + lane / 4, column
 * 2 (lane % 4): mma_c_lane_row / mma_c_lane_col within the warp's 16 rows). */
__host__ __device__ constexpr int wgmma_d_row(int v) { return FRAG_HALF_ROWS * ((v >> 1) & 1); }
__host__ __device__ constexpr int wgmma_d_col(int v) { return FRAG_N8 * (v >> 2) + (v & 1); }

#endif
