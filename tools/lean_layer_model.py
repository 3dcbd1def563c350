#!/usr/bin/env python3
"""A PyTorch model of one Llama-3.1-8B layer's recompute + backward in Hearth's long-context LoRA
training (segment 1, LoRA rank 8 on every projection, MLP checkpointed 16,384 positions at a time,
causal SDPA), to compare the reference autograd of LlamaRMSNorm / RoPE / repeat_kv with the lean
design of src/nn/lean_grad.cpp (custom Functions of the same ops) and SDPA's enable_gqa. Prints the
CUDA allocator's peak above the layer's input, output cotangent and weights. Not Hearth itself.

  python3 tools/lean_layer_model.py TOKENS LEAN(0|1)     # e.g. 524288 1 (one H200: 86.1 / 51.8 GB)
"""
import torch,torch.nn.functional as F,sys
from torch.utils.checkpoint import checkpoint as ck
d='cuda';bf=torch.bfloat16;T=int(sys.argv[1]);lean=sys.argv[2]=='1'
C,H,K,D,I,r=4096,32,8,128,14336,8
def P(*s):return torch.randn(*s,device=d,dtype=bf)*0.02
S=dict(q=(H*D,C),k=(K*D,C),v=(K*D,C),o=(C,H*D),g=(I,C),u=(I,C),n=(C,I))
W={n:P(*s) for n,s in S.items()};A={n:P(r,s[1]).requires_grad_() for n,s in S.items()};B={n:P(s[0],r).requires_grad_() for n,s in S.items()}
w1=1+P(C);w2=1+P(C)
def lin(x,n):return x@W[n].t()+(x@A[n].t())@B[n].t()
class N(torch.autograd.Function):
 @staticmethod
 def forward(c,x,w):
  h=x.float();r=torch.rsqrt(h.pow(2).mean(-1,True)+1e-5);h.mul_(r);c.save_for_backward(x,w,r);return w*h.to(x.dtype)
 @staticmethod
 def backward(c,g):
  x,w,r=c.saved_tensors;dx=torch.empty_like(x)
  for s in range(0,x.shape[1],4096):
   e=slice(s,s+4096);h=x[:,e].float();q=r[:,e];dn=(g[:,e]*w).float();dr=(dn*h).sum(-1,True);dx[:,e]=dn*q+h*(dr*q**3*(-1/C))
  return dx,None
def norm(x,w):
 if lean:return N.apply(x,w)
 h=x.float();h=h*torch.rsqrt(h.pow(2).mean(-1,True)+1e-5);return w*h.to(x.dtype)
class R(torch.autograd.Function):
 @staticmethod
 def forward(c,x,co,si):
  o=x*co;o[...,:64]-=x[...,64:]*si[...,:64];o[...,64:]+=x[...,:64]*si[...,64:];c.save_for_backward(co,si);return o
 @staticmethod
 def backward(c,g):
  co,si=c.saved_tensors;dx=g*co;dx[...,:64]+=g[...,64:]*si[...,64:];dx[...,64:]-=g[...,:64]*si[...,:64];return dx,None,None
def rope(x,co,si):
 if lean:return R.apply(x,co,si)
 return x*co+torch.cat((-x[...,64:],x[...,:64]),-1)*si
def rep(x):return x[:,:,None].expand(1,K,4,T,D).reshape(1,H,T,D)
f=torch.arange(T,device=d,dtype=torch.float)[:,None]*(500000**(-torch.arange(0,D,2,device=d)/D))[None];e=torch.cat((f,f),-1);co=e.cos().to(bf);si=e.sin().to(bf)
def mlp(h):return lin(F.silu(lin(h,'g'))*lin(h,'u'),'n')
def layer(x):
 h=norm(x,w1);q=rope(lin(h,'q').view(1,T,H,D).transpose(1,2),co,si);k=rope(lin(h,'k').view(1,T,K,D).transpose(1,2),co,si);v=lin(h,'v').view(1,T,K,D).transpose(1,2)
 a=F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True) if lean else F.scaled_dot_product_attention(q,rep(k),rep(v),is_causal=True)
 x=x+lin(a.transpose(1,2).reshape(1,T,H*D),'o');h=norm(x,w2)
 return x+torch.cat([ck(mlp,h[:,s:s+16384],use_reentrant=False) for s in range(0,T,16384)],1)
x=P(1,T,C).requires_grad_();g=P(1,T,C);torch.cuda.synchronize();b=torch.cuda.memory_allocated();torch.cuda.reset_peak_memory_stats()
import time;t=time.time();layer(x).backward(g);torch.cuda.synchronize()
print('T',T,'lean',lean,'layer fwd+bwd peak above inputs+weights GB %.2f'%((torch.cuda.max_memory_allocated()-b)/1e9),'s %.1f'%(time.time()-t))
