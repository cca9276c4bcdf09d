"""i34_t5_v14's numerics, on the CPU: T5's table gradient in the bucket beyond -range summed directly (as v13) and
derived from the rows' zero sums (v14: minus every other dS), both with delta from a bf16-rounded O (the kernels'),
against float64 with the exact O; errors relative to the table gradient's largest entry, as test_rel_bias measures.
Usage: python3 dev/pending/scripts/t5_zero_sum_num.py (torch, ~1 min)."""
import torch, math
torch.manual_seed(0)
def bucket(rel, nb=32, md=128, bidir=False):
    # transformers T5 bucketing; rel = j - i
    ret = torch.zeros_like(rel)
    n = -rel
    if bidir:
        nb //= 2
        ret += (n < 0).long() * nb
        n = n.abs()
    else:
        n = n.clamp(min=0)
    me = nb // 2
    small = n < me
    large = me + (torch.log(n.float().clamp(min=1) / me) / math.log(md / me) * (nb - me)).long()
    large = large.clamp(max=nb - 1)
    return ret + torch.where(small, n, large)
for s, causal, bidir, d in ((777, True, False, 128), (1000, False, True, 128), (4096, True, False, 128)):
    h = 4
    q, k, v, do = (torch.randn(1, h, s, d, dtype=torch.float64) for _ in range(4))
    q, k, v, do = (x.to(torch.bfloat16).double() for x in (q, k, v, do))
    table = torch.randn(h, 32, dtype=torch.float64)
    i = torch.arange(s)[:, None]; j = torch.arange(s)[None, :]
    bk = bucket(j - i, bidir=bidir)
    S = q @ k.transpose(-1, -2) / math.sqrt(d) + table[:, bk]
    if causal:
        S = S.masked_fill(j > i, -math.inf)
    P = S.softmax(-1)
    O = P @ v
    dP = do @ v.transpose(-1, -2)
    for name, Ou in (("exact", O), ("bf16 O", O.to(torch.bfloat16).double())):
        delta = (do * Ou).sum(-1, keepdim=True)
        dS = P * (dP - delta)
        g = torch.zeros(h, 32, dtype=torch.float64)
        g.scatter_add_(1, bk.expand(h, s, s).reshape(h, -1), dS.reshape(h, -1))
        far_lo = bucket(torch.tensor([-10**6]), bidir=bidir).item()
        far_mask = (j - i) <= -128
        direct = g[:, far_lo]
        derived = g[:, far_lo] - dS.sum((-1, -2))  # the far-lo bucket from the zero row sums
        if name == "exact":
            ref = g.clone(); scale = max(1.0, ref.abs().max().item())
            print(f"s{s} causal={causal} bidir={bidir}: max|dtable| {ref.abs().max():.3g}, far-lo bucket {ref[:, far_lo].tolist()}")
        else:
            print(f"   {name}: direct err {((direct - ref[:, far_lo]).abs().max() / scale):.2e}, derived err {((derived - ref[:, far_lo]).abs().max() / scale):.2e}; other buckets' err {((g - ref).abs().max() / scale):.2e}")
