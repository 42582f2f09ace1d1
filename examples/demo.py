"""`make demo`: this machine's facts, explain for both ops here and on two profiles, and a real
dispatch of both ops on this machine (the CPU when there is no GPU). Embedded: no daemon."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.pop("KREG_DAEMON", None)  # the demo is the embedded path


def kreg(*args: str) -> None:
    print(f"\n$ kreg {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "cli", *args], check=True)


SEED_CHUNK = ("kind=chunk,topk=2051,head_dim=256,group_size=6,num_kv_heads=1,"
              "total_q=8192,num_requests=1,max_q=8192,dtype=bfloat16")
TOPK = "k=2048,num_rows=64,max_keys=131072,dtype=float32"

kreg("devices")
kreg("explain", "sparse_prefill", "-w", SEED_CHUNK.replace("bfloat16", "float32"))
kreg("explain", "indexer_topk", "-w", TOPK)
kreg("explain", "sparse_prefill", "--device", "rtx-pro-6000-blackwell-server", "-w", SEED_CHUNK)
kreg("explain", "sparse_prefill", "--device", "rtx-5090", "-w", SEED_CHUNK)
kreg("explain", "indexer_topk", "--device", "mi355x", "-w", TOPK)

print("\n$ python: registry.dispatch on this machine", flush=True)
import torch  # noqa: E402

import registry  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
gen = torch.Generator().manual_seed(0)
total_q, hq, hk, d, slots, topk = 64, 6, 1, 64, 256, 40
q = torch.randn(total_q, hq, d, generator=gen).to(dev, dtype)
k = torch.randn(slots, hk, d, generator=gen).to(dev, dtype)
v = torch.randn(slots, hk, d, generator=gen).to(dev, dtype)
idx = torch.randint(-4, slots + 4, (total_q, topk), generator=gen, dtype=torch.int32).to(dev)
out = registry.dispatch("sparse_prefill", q, k, v, idx, kind="prefill")
d1 = registry.select("sparse_prefill", {"kind": "prefill", "topk": topk, "head_dim": d,
                                        "group_size": hq // hk, "num_kv_heads": hk,
                                        "total_q": total_q, "num_requests": 1, "max_q": total_q,
                                        "dtype": str(dtype).removeprefix("torch.")})
print(f"sparse_prefill: out {tuple(out.shape)} {out.dtype} finite={bool(out.isfinite().all())}")
print("  " + d1.one_line())

scores = torch.randn(8, 4096, generator=gen).to(dev)
lengths = torch.tensor([0, 1, 100, 2047, 2048, 2049, 4000, 4096], dtype=torch.int32).to(dev)
top = registry.dispatch("indexer_topk", scores, lengths, k=2048)
d2 = registry.select("indexer_topk", {"k": 2048, "num_rows": 8, "max_keys": 4096,
                                      "dtype": "float32"})
print(f"indexer_topk: out {tuple(top.shape)} {top.dtype}; valid per row "
      f"{(top >= 0).sum(dim=1).tolist()}")
print("  " + d2.one_line())

if dev == "cpu":
    print("\n$ TRITON_INTERPRET=1 python examples/demo_interpreter.py  "
          "(the Triton kernels on this CPU)", flush=True)
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    subprocess.run([sys.executable, str(here / "demo_interpreter.py")], check=True,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
