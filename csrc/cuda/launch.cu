/* launch.cu: the one dispatcher of the CUDA code. dtype (fp32/fp64 -> CUDA-core kernels, fp16/bf16 ->
 * tensor-core kernels) -> shape (forward: a few rows per KV head -> the split-KV decode kernel) -> arch (Hopper with an sm_90a build: the
 * wgmma + TMA forward where it serves p, the wgmma backward main kernel) -> tile
 * configuration (large tiles where the device's shared memory allows) -> variant (p->has_hook, chosen
 * inside each family's launcher from the same field). T5's rel_bias goes to the fp32 / fp64 kernels only. The kernels' own files hold the tile constants
 * next to the measurements that justify them. Variable-length batches and KV caches go the same way:
 * their grids cover the max lengths p->sq / p->sk, so the early-outs below hold for them too. */
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "../mask.h"

/* The current device's opt-in shared memory per CTA, capped by FLASHATTN_EXT_SMEM_LIMIT (bytes; read
 * once) so that the small configurations can be tested on a large GPU. 0 if the query fails. */
extern "C" size_t flash_smem_available(void)
{
    static long long cap = -1;
    if (cap < 0) {
        const char *env = getenv("FLASHATTN_EXT_SMEM_LIMIT");
        cap = env != NULL && atoll(env) > 0 ? atoll(env) : 0;
    }
    int dev = 0, bytes = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return cap > 0 && (size_t)cap < (size_t)bytes ? (size_t)cap : (size_t)bytes;
}

/* Hopper kernels (the wgmma forward and main backward kernels): an sm_90a build, an sm_90 device, and
 * FLASHATTN_EXT_DISABLE_SM90 unset (=1 forces the sm80 kernels on Hopper, for comparisons; read once per
 * process). */
static int use_sm90(void)
{
#ifdef FLASHATTN_EXT_SM90A
    static int disabled = -1;
    if (disabled < 0) {
        const char *env = getenv("FLASHATTN_EXT_DISABLE_SM90");
        disabled = env != NULL && env[0] != '\0' && env[0] != '0';
    }
    int dev = 0, major = 0;
    if (disabled || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return 0;
    return major == 9;
#else
    return 0;
#endif
}

/* Whether the current device takes programmatic dependent launches (sm90+). */
static int has_pdl(void)
{
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
}

extern "C" void flash_launch_pdl(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, int pdl)
{
    memset(attr, 0, sizeof(*attr));
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = attr;
    cfg->numAttrs = pdl && has_pdl() ? 1 : 0;
}

static int is_simple(const flash_params *p)
{
    return p->dtype == FLASH_FP32 || p->dtype == FLASH_FP64;
}

/* FLASHATTN_EXT_DISABLE_DECODE=1 turns the decode kernel off (read per call, so a benchmark can compare both in one
 * process). */
static int decode_disabled(void)
{
    const char *env = getenv("FLASHATTN_EXT_DISABLE_DECODE");
    return env != NULL && env[0] != '\0' && env[0] != '0';
}

/* The shared memory per block that the forward of p needs: the least of the families that take p, decode where it
 * serves p (on sm86 / sm89 at head dims 129-256 the only one that fits their 99 KB) and fwd_sm80, which takes every
 * fp16 / bf16 call (Hopper's fwd_sm90 never needs more than Hopper has). */
extern "C" size_t flash_fwd_smem_needed(const flash_params *p)
{
    const size_t sm80 = flash_fwd_sm80_smem(p);
    if (is_simple(p) || decode_disabled() || !flash_fwd_decode_ok(p))
        return sm80;
    const size_t decode = flash_fwd_decode_smem(p);
    return decode < sm80 ? decode : sm80;
}

extern "C" size_t flash_bwd_smem_needed(const flash_params *p)
{
    return flash_bwd_sm80_smem(p, FLASH_TILES_SMALL);
}

/* The decode kernel (fwd_decode.cu) for what it serves, where the device has its shared memory, unless
 * decode_disabled(). */
static int use_decode(const flash_params *p)
{
    if (decode_disabled() || is_simple(p) || !flash_fwd_decode_ok(p))
        return 0;
    return flash_smem_available() >= flash_fwd_decode_smem(p);
}

extern "C" int flash_fwd_splits(const flash_params *p, int requested)
{
    int dev = 0, sms = 0;
    if (!use_decode(p) || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return flash_fwd_decode_splits(p, requested, sms);
}

/* The forward kernel family that runs p. */
typedef enum { FWD_SIMPLE, FWD_DECODE, FWD_SM90, FWD_SM80 } fwd_family;

static fwd_family fwd_family_of(const flash_params *p)
{
    if (is_simple(p))
        return FWD_SIMPLE;
    if (use_decode(p))
        return FWD_DECODE;
#ifdef FLASHATTN_EXT_SM90A
    if (use_sm90() && flash_fwd_sm90_ok(p) && flash_smem_available() >= flash_fwd_sm90_smem(p))
        return FWD_SM90;
#endif
    return FWD_SM80;
}

extern "C" int flash_fwd_wants_tile_counter(const flash_params *p)
{
#ifdef FLASHATTN_EXT_SM90A
    return fwd_family_of(p) == FWD_SM90 && flash_fwd_sm90_dynamic(p);
#else
    return 0;
#endif
}

/* The kernel files that the process's last forward and backward launched (flash_last_kernels): process-wide, as
 * autograd runs a CUDA backward on its own device thread, not the caller's. Relaxed atomics: static strings. */
static const char *last_fwd = NULL, *last_bwd = NULL;

static void record_kernels(const char **slot, const char *name)
{
    __atomic_store_n(slot, name, __ATOMIC_RELAXED);
}

extern "C" void flash_last_kernels(const char **fwd, const char **bwd)
{
    *fwd = __atomic_load_n(&last_fwd, __ATOMIC_RELAXED);
    *bwd = __atomic_load_n(&last_bwd, __ATOMIC_RELAXED);
}

extern "C" cudaError_t flash_fwd_cuda(const flash_params *p, cudaStream_t stream)
{
    if (p->rel_bias != NULL && !is_simple(p))
        return cudaErrorInvalidValue; /* T5's table: the simple kernels only (score.h FLASH_SCORE_TABLE) */
    switch (fwd_family_of(p)) {
    case FWD_SIMPLE:
        record_kernels(&last_fwd, "simple.cu");
        return flash_fwd_simple(p, stream);
    case FWD_DECODE:
        record_kernels(&last_fwd, p->num_splits > 1 ? "fwd_decode.cu (split keys)" : "fwd_decode.cu");
        return flash_fwd_decode(p, stream);
#ifdef FLASHATTN_EXT_SM90A
    case FWD_SM90:
        record_kernels(&last_fwd, "fwd_sm90.cu");
        return flash_fwd_sm90(p, stream);
#endif
    default:
        record_kernels(&last_fwd, "fwd_sm80.cu");
        return flash_fwd_sm80(p, stream);
    }
}

/* The backward's main kernel on Hopper: bwd_sm90.cu's up to head dim 256, above it bwd_sm80.cu's d512 config. */
static int bwd_sm90(const flash_params *p)
{
    return use_sm90() && p->d <= FLASH_CUDA_MAX_HEAD_DIM;
}

extern "C" int flash_bwd_wants_dq_semaphore(const flash_params *p)
{
    return !is_simple(p) && p->deterministic && bwd_sm90(p) && flash_bwd_sm90_orders_dq(p);
}

/* 1 where dq_accum is in the tiled layout (launch.h flash_bwd_pre_tiled): where bwd_sm90.cu's d > 128 kernel
 * runs p. */
static int bwd_dq_tiled(const flash_params *p)
{
    return !is_simple(p) && p->d > 128 && bwd_sm90(p);
}

extern "C" int64_t flash_bwd_dq_accum_floats(const flash_params *p)
{
    if (bwd_dq_tiled(p))
        return flash_dq_tiled_floats(p);
    return (p->cu_seqlens_q ? p->total_q : p->b * p->sq) * p->h * p->d;
}

/* The preprocess and the dQ postprocess of p's dq_accum layout. */
static cudaError_t bwd_pre(const flash_params *p, cudaStream_t stream)
{
    if (bwd_dq_tiled(p))
        return flash_bwd_pre_tiled(p, stream);
    return flash_bwd_pre(p, stream);
}

static cudaError_t bwd_dq_post(const flash_params *p, int pdl, cudaStream_t stream)
{
    if (bwd_dq_tiled(p))
        return flash_bwd_dq_post_tiled(p, pdl, stream);
    return flash_bwd_dq_post(p, pdl, stream);
}

extern "C" int64_t flash_bwd_rel_grad_tile(const flash_params *p)
{
    return is_simple(p) ? flash_bwd_simple_rel_grad_tile() : 0;
}

extern "C" cudaError_t flash_bwd_cuda(const flash_params *p_in, cudaStream_t stream)
{
    if (is_simple(p_in)) {
        record_kernels(&last_bwd, "simple.cu");
        return flash_bwd_simple(p_in, stream);
    }
    /* with an additive attn_mask (dout_fix set) the preprocess reads dout and lse and writes dout_fix and lse_fix,
     * which every later kernel reads instead (flash.h): the main kernel, the dQ kernel (deterministic mode where
     * the main kernel does not order dQ) and the postprocesses all run with `fixed` */
    flash_params fixed = *p_in;
    const flash_params *p = &fixed;
    if (p->rel_bias != NULL || p->rel_bias_grad != NULL)
        return cudaErrorInvalidValue; /* T5's table: the simple kernels only (score.h FLASH_SCORE_TABLE) */
    cudaError_t err = flash_bwd_sm80_check(p);
    if (err != cudaSuccess || p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0)
        return err;
    const size_t smem = flash_smem_available();
    const flash_tiles tiles = smem >= flash_bwd_sm80_smem(p, FLASH_TILES_LARGE) ? FLASH_TILES_LARGE : FLASH_TILES_SMALL;
    if (smem < flash_bwd_sm80_smem(p, tiles))
        return cudaErrorInvalidConfiguration;
    if ((err = bwd_pre(p, stream)) != cudaSuccess)
        return err;
    if (fixed.dout_fix != NULL) {
        fixed.dout = fixed.dout_fix;
        fixed.do_s = flash_dout_fix_strides(&fixed);
        fixed.lse = fixed.lse_fix;
    }
    const int sm90 = bwd_sm90(p);
    err = sm90 ? flash_bwd_main_sm90(p, stream) : flash_bwd_main_sm80(p, tiles, stream);
    if (err != cudaSuccess)
        return err;
    /* deterministic mode: dQ in the main kernel's fixed order where it has the semaphores, else the dQ kernel */
    const int dq_added = !p->deterministic || (p->dq_semaphore != NULL && flash_bwd_wants_dq_semaphore(p));
    static const char *const bwd_names[3][2] = { /* [sm90 / sm80 large / sm80 small][dQ by the dQ kernel] */
        {"bwd_sm90.cu", "bwd_sm90.cu, dQ by bwd_sm80.cu's dQ kernel"},
        {"bwd_sm80.cu (large tiles)", "bwd_sm80.cu (large tiles, dQ kernel)"},
        {"bwd_sm80.cu (small tiles)", "bwd_sm80.cu (small tiles, dQ kernel)"}};
    record_kernels(&last_bwd, bwd_names[sm90 ? 0 : tiles == FLASH_TILES_LARGE ? 1 : 2][!dq_added]);
    /* after flash_bwd_main_sm90: a programmatic dependent launch (launch.h) */
    err = dq_added ? bwd_dq_post(p, sm90, stream) : flash_bwd_sm80_dq(p, tiles, stream);
    if (err != cudaSuccess)
        return err;
    if (p->h != p->h_kv)
        return flash_bwd_dkv_post(p, stream);
    return cudaSuccess;
}
