import torch, time, sys, flashattn_ext
from flashattn_ext import flash_attn_func
torch.set_num_threads(1)
import torch.nn.functional as F
dt=torch.bfloat16
causal=False
out=[]
for S in [int(x) for x in sys.argv[1:]] or [512,1024,2048]:
    B,H,D=1,8,64
    q,k,v=[torch.randn(B,S,H,D,dtype=dt,requires_grad=True) for _ in range(3)]
    qt,kt,vt=[x.detach().transpose(1,2).requires_grad_() for x in (q,k,v)]
    fs={'ours':lambda: flash_attn_func(q,k,v), 'sdpa':lambda: F.scaled_dot_product_attention(qt,kt,vt)}
    n=max(3,int(8*1024/S))
    res={a:[] for a in fs}
    for r in range(12):
        for name,f in fs.items():
            t=time.perf_counter()
            for _ in range(n): o=f()
            res[name].append((time.perf_counter()-t)/n)
    mo=min(res['ours']); ms=min(res['sdpa'])
    out.append('%d %.3f/%.3f=%.3f'%(S,mo*1e3,ms*1e3,mo/ms))
print('  '.join(out))
