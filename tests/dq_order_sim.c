/* dq_order_sim.c: a host simulation of the deterministic backward's ordered dQ additions (bwd_sm90.cu,
 * dq_order / dq_reducer of the ORDERED kernels) on the geometry of csrc/mask.h, run by tests/test_dq_order.py.
 *
 * For random sequences (lengths, causal alignments, windows), tile sizes and hidden tiles (an attn_mask's
 * empty blocks, which the HOOK kernels do not walk), it checks what the protocol relies on and what it
 * promises:
 *   - the query tiles that a key tile sees (flash_query_tiles of its keys, as the kernels compute them) are
 *     exactly those holding a visible (i, j) pair (brute force over flash_visible, for the smaller shapes);
 *   - the key tiles that see one query tile are contiguous;
 *   - mask.h's flash_group_walk visits every (head, key tile) of the grid once;
 *   - CTAs of 1-3 heads dispatched in the grid's order (bwd90_cta_descending: in groups of heads, key tile
 *     descending as the outer index inside a group, head inner) onto a few resident slots, each walking its
 *     band in order and running in a random interleaving, never deadlock: key tile t adds query tile m
 *     after waiting for the value t + 2 where key tile t + 1 of its head sees m, then stores t + 1;
 *   - every query tile receives the additions of exactly the key tiles that walk it, in descending order.
 * Prints one line per failure and "ok N" at the end; exit status 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mask.h"

#define CASES 20000
#define BRUTE_MAX 700       /* brute-force check of the tile ranges up to this sq and sk */
#define MAX_TILES 64        /* key / query tiles of one simulated sequence at most */
#define MAX_SLOTS 8         /* resident CTAs at most */
#define MAX_EXTRA 3         /* grid tiles past the sequence's keys (a varlen grid spans the longest one) */
#define MAX_HEADS 3         /* heads of one simulated grid */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n) /* uniform in [0, n) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* The query tiles that key tile t sees, as the kernels compute them (bwd_sm90.cu: the CTA's own range,
 * and dq_order_of's range of tile t + 1): none past the sequence's keys. */
static flash_tile_range key_tile_queries(const flash_seq *s, int64_t t, int64_t bn, int64_t bm)
{
    const int64_t k0 = t * bn;
    if (k0 >= s->sk) {
        const flash_tile_range none = {0, 0, 0, 0};
        return none;
    }
    return flash_query_tiles(s, k0, flash_min64(bn, s->sk - k0), bm);
}

static int in_range(const flash_tile_range *r, int64_t m) { return m >= r->first && m < r->end; }

/* One CTA of the simulation: key tile t of head h walking query tiles cur .. end - 1 of its band. */
typedef struct cta {
    int t, h, cur, end;
} cta;

static int failures = 0;

static void fail(const char *what, int64_t sq, int64_t sk, int64_t left, int64_t right, int br, int bm, int bn)
{
    if (failures++ < 20)
        printf("FAIL %s: sq %lld sk %lld window (%lld, %lld) bottom_right %d bm %d bn %d\n", what, (long long)sq,
               (long long)sk, (long long)left, (long long)right, br, bm, bn);
}

int main(void)
{
    int cases = 0;
    for (int c = 0; c < CASES; ++c) {
        const int bm = rnd(2) ? 64 : 128, bn = rnd(2) ? 64 : 128;
        const int64_t sq = 1 + rnd(c % 3 == 0 ? BRUTE_MAX : MAX_TILES * 64);
        const int64_t sk = 1 + rnd(c % 3 == 0 ? BRUTE_MAX : MAX_TILES * 64);
        const int kind = rnd(4); /* 0 none, 1 causal, 2 window, 3 one-sided window */
        const int64_t left = kind == 2 || (kind == 3 && rnd(2)) ? (int64_t)rnd(600) : -1;
        const int64_t right = kind == 1 ? 0 : kind == 2 || (kind == 3 && left < 0) ? (int64_t)rnd(600) : -1;
        flash_params p;
        memset(&p, 0, sizeof(p));
        p.b = 1;
        p.sq = sq;
        p.sk = sk;
        p.band_left = left;
        p.band_right = right;
        p.band_bottom_right = (int)rnd(2);
        const flash_seq s = flash_seq_of(&p, 0);
        const int nt = (int)flash_cdiv64(sk, bn), nm = (int)flash_cdiv64(sq, bm);
        if (nt > MAX_TILES || nm > MAX_TILES)
            continue;
        ++cases;
        const int grid = nt + (int)rnd(MAX_EXTRA + 1); /* the grid's key tiles; those past sk return at once */
        flash_tile_range own[MAX_TILES + MAX_EXTRA + 1];
        for (int t = 0; t <= grid; ++t)
            own[t] = key_tile_queries(&s, t, bn, bm);

        /* the ranges are exact, and the key tiles of a query tile contiguous */
        for (int m = 0; m < nm; ++m) {
            int first = -1, last = -1, gaps = 0;
            for (int t = 0; t < nt; ++t) {
                if (!in_range(&own[t], m))
                    continue;
                if (last >= 0 && last != t - 1)
                    gaps = 1;
                if (first < 0)
                    first = t;
                last = t;
            }
            if (gaps)
                fail("the key tiles that see a query tile are not contiguous", sq, sk, left, right,
                     p.band_bottom_right, bm, bn);
            if (sq > BRUTE_MAX || sk > BRUTE_MAX)
                continue;
            for (int t = 0; t < nt; ++t) {
                int any = 0;
                for (int64_t i = (int64_t)m * bm; i < flash_min64(sq, (int64_t)(m + 1) * bm) && !any; ++i)
                    for (int64_t j = (int64_t)t * bn; j < flash_min64(sk, (int64_t)(t + 1) * bn) && !any; ++j)
                        any = flash_visible(&s, i, j);
                if (any != in_range(&own[t], m))
                    fail("flash_query_tiles differs from the visible pairs", sq, sk, left, right,
                         p.band_bottom_right, bm, bn);
            }
        }

        /* hidden tiles: walked by none (the HOOK kernels skip them), still passed on in the chain */
        unsigned char hidden[MAX_TILES][MAX_TILES];
        const int hide = rnd(3) == 0 ? 1 + (int)rnd(3) : 0; /* one in hide + 1 hidden, or none */
        for (int t = 0; t < nt; ++t)
            for (int m = 0; m < nm; ++m)
                hidden[t][m] = hide && rnd(hide + 1) == 0;

        /* the chain: dispatch in the grid's order onto `slots` resident CTAs, heads in groups of `group`, key
         * tile grid - 1 of each head of a group first (mask.h flash_group_walk, reversed: bwd90_cta_descending);
         * the walk visits every (head, key tile) once */
        const int heads = 1 + (int)rnd(MAX_HEADS), group = 1 + (int)rnd(heads);
        int order_t[MAX_HEADS * (MAX_TILES + MAX_EXTRA)], order_h[MAX_HEADS * (MAX_TILES + MAX_EXTRA)], norder = 0;
        unsigned char seen[MAX_HEADS][MAX_TILES + MAX_EXTRA];
        memset(seen, 0, sizeof(seen));
        for (; norder < heads * grid; ++norder) {
            uint32_t pair, pos;
            flash_group_walk((uint32_t)norder, (uint32_t)grid, (uint32_t)heads, (uint32_t)group, &pair, &pos);
            if (pair >= (uint32_t)heads || pos >= (uint32_t)grid || seen[pair][pos]++) {
                fail("the grouped walk is not a permutation of the grid", sq, sk, left, right, p.band_bottom_right,
                     bm, bn);
                break;
            }
            order_t[norder] = grid - 1 - (int)pos;
            order_h[norder] = (int)pair;
        }
        if (norder < heads * grid)
            continue;
        int32_t sem[MAX_HEADS][MAX_TILES];
        int added[MAX_HEADS][MAX_TILES][MAX_TILES], nadded[MAX_HEADS][MAX_TILES];
        memset(sem, 0, sizeof(sem));
        memset(nadded, 0, sizeof(nadded));
        const int slots = 1 + (int)rnd(MAX_SLOTS);
        cta resident[MAX_SLOTS];
        int nres = 0, next = 0, deadlock = 0;
        while (next < norder || nres > 0) {
            while (nres < slots && next < norder) { /* in-order dispatch */
                const int t = order_t[next];
                resident[nres].t = t;
                resident[nres].h = order_h[next];
                resident[nres].cur = (int)own[t].first;
                resident[nres].end = (int)own[t].end;
                ++nres;
                ++next;
            }
            int ready[MAX_SLOTS], nready = 0;
            for (int r = 0; r < nres; ++r) {
                const cta *x = &resident[r];
                const int waits = x->cur < x->end && in_range(&own[x->t + 1], x->cur);
                if (x->cur >= x->end || !waits || sem[x->h][x->cur] == x->t + 2)
                    ready[nready++] = r;
            }
            if (nready == 0) {
                deadlock = 1;
                break;
            }
            const int r = ready[rnd(nready)];
            cta *x = &resident[r];
            if (x->cur >= x->end) { /* done: its slot goes to the next CTA */
                resident[r] = resident[--nres];
                continue;
            }
            if (!hidden[x->t][x->cur])
                added[x->h][x->cur][nadded[x->h][x->cur]++] = x->t;
            sem[x->h][x->cur] = x->t + 1;
            ++x->cur;
        }
        if (deadlock) {
            fail("the chain deadlocks", sq, sk, left, right, p.band_bottom_right, bm, bn);
            continue;
        }
        for (int h = 0; h < heads; ++h)
            for (int m = 0; m < nm; ++m) {
                int k = 0, ok = 1;
                for (int t = nt - 1; t >= 0; --t)
                    if (in_range(&own[t], m) && !hidden[t][m])
                        ok &= k < nadded[h][m] && added[h][m][k++] == t;
                if (!ok || k != nadded[h][m])
                    fail("a query tile's additions are not those of its key tiles in descending order", sq, sk,
                         left, right, p.band_bottom_right, bm, bn);
            }
    }
    if (failures)
        return 1;
    printf("ok %d\n", cases);
    return 0;
}
